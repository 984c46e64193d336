"""`make demo`: the scheduler at work, end to end, in well under a minute.

Starts a dev cluster (3 agents and the scheduler under gunicorn, its own node registry:
`REGISTRY_URL=builtin`; short intervals), submits a handful of jobs that show what the
scheduler does — a success, environment variables, a failure retried on another node, a
failure that stays failed, a long-running service, a drained node that gets no new job, a
running job cancelled and stopped by its agent, a run timeout, a delayed job, an agent killed
and restarted under its running job, a job no node could ever run refused at once, one pinned
to a node, an array and a held job — follows them live, creates an every-minute schedule and
shows when it fires next (a real fire would take up to a minute of waiting: `tiny-scheduler
schedule list` in a dev cluster shows it), prints a summary table, and stops everything.
Exits 0 only when every job ended as it should, so it doubles as a smoke test.

It is a client of the public API only (plus a look at /proc, to show that a stopped job's
process is gone): it shows behaviour, it does not define any.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
import time
from collections.abc import Callable
from typing import Any

import requests

from ..client import Client, ClientError, job_state, settled
from ..display import describe, format_table
from ..domain.jobs import FINAL_STATUSES, TIMED_OUT_STDERR, parse_time
from .cluster import ClusterConfig, ClusterError, DevCluster
from .daemon import PortReservation

TRACK_INTERVAL_SECS = 0.2
"""Seconds between two looks at the demo's jobs."""

PHASE_TIMEOUT_SECS = 20.0
"""Seconds a phase may take before the demo stops waiting and reports what it saw."""

TIMEOUT_JOB_SECS = 2
"""The run timeout of the job that is meant to time out."""

DELAY_SECS = 2
"""How long the delayed job is held back from the agents."""


@dataclasses.dataclass
class Shown:
    """One job of the demo: what it shows, and how it should end."""

    label: str
    expected: str  # said in the summary when the job did not end that way
    check: Callable[[dict[str, Any]], bool]
    job: dict[str, Any] = dataclasses.field(default_factory=dict)
    note: str = ""  # an extra fact for the summary (the service's HTTP answer)
    note_ok: bool = True  # whether that fact is as it should be

    @property
    def job_id(self) -> str:
        return self.job["job_id"]

    @property
    def ok(self) -> bool:
        return bool(self.job) and self.check(self.job) and self.note_ok


class Demo:
    """Runs the demo's phases against a started cluster and prints as it goes."""

    def __init__(self, cluster: DevCluster) -> None:
        self.cluster = cluster
        self.client = Client(cluster.scheduler_url)
        self.shown: list[Shown] = []
        self.started = time.monotonic()
        self._last_seen: dict[str, tuple[Any, ...]] = {}

    def say(self, line: str = "") -> None:
        print(line, flush=True)

    def submit(self, shown: Shown, **body: Any) -> Shown:
        shown.job = self.client.submit(body)
        self.shown.append(shown)
        self._last_seen[shown.job_id] = job_state(shown.job)
        self.say(f"  submitted {shown.job_id:<7} {shown.label:<22} -> {shown.job['node_id']}")
        return shown

    # --- the phases -------------------------------------------------------------------------

    def run(self) -> bool:
        self.phase_one()
        self.phase_two()
        self.phase_three()
        self.phase_four()
        self.phase_five()
        self.summary()
        return all(shown.ok for shown in self.shown)

    def phase_one(self) -> None:
        self.say("\n1) five jobs at once, spread over the nodes (least-loaded first)")
        mark = os.path.join(self.cluster.work_dir, "flaky.mark")
        self.submit(
            Shown("success", "done, exit 0", lambda j: _done_with(j, "hello from node-")),
            command='echo "hello from $TINY_NODE_ID"',
        )
        self.submit(
            Shown(
                "env vars",
                "done, printing the variables",
                lambda j: _done_with(j, "Hello, tiny-scheduler!"),
            ),
            command='echo "$GREETING, $WHO!"',
            env_vars={"GREETING": "Hello", "WHO": "tiny-scheduler"},
        )
        self.submit(
            Shown(
                "retried elsewhere",
                "done on its second node after one failed attempt",
                _retried_elsewhere,
            ),
            # Fails the first time it runs, wherever that is; the retry goes to another node.
            command=(
                'if [ -e "$MARK" ]; then echo "second try worked on $TINY_NODE_ID"; '
                'else touch "$MARK"; echo "first try failed on $TINY_NODE_ID" >&2; exit 3; fi'
            ),
            env_vars={"MARK": mark},
        )
        self.submit(
            Shown(
                "failure",
                "failed with exit 2 after a retry",
                lambda j: (
                    j["status"] == "failed"
                    and j.get("exit_code") == 2
                    and len(j.get("attempts", [])) == 1
                ),
            ),
            command='echo "cannot open settings.yml" >&2; exit 2',
        )
        # Held until the service answers on it: http.server binds with SO_REUSEADDR.
        with PortReservation() as port:
            serve = f"exec {shlex.quote(sys.executable)} -m http.server {port} --bind 127.0.0.1"
            service = self.submit(
                Shown("service", "running and answering HTTP", lambda j: j["status"] == "running"),
                command=serve,
                job_type="service",
                port=port,
            )
            self.follow(lambda: all(settled(s.job) for s in self.shown))
            service.note = _probe_service(port)
        service.note_ok = service.note.startswith("HTTP 200")
        self.say(f"  service {service.job_id} on port {port}: {service.note}")

    def phase_two(self) -> None:
        self.say("\n2) a drain, a cancel and a timeout")
        # A drained node gets no new job; with the other two busy (one slot each), the third
        # job below waits for one of them rather than going there.
        drained = self.cluster.node_ids[-1]
        self.client.json("PATCH", f"/nodes/{drained}", json={"drain": True})
        self.say(f"  drained {drained}: it takes no new job (its running ones would finish)")
        pid_file = os.path.join(self.cluster.work_dir, "cancelled.pid")
        cancelled = self.submit(
            Shown(
                "cancel while running",
                "cancelled, its process stopped by its agent",
                lambda j: j.get("reason") == "cancelled" and j["retry_count"] == 0,
            ),
            command=f"echo $$ > {shlex.quote(pid_file)}; sleep 30",
        )
        self.submit(
            Shown(
                "timeout",
                f"failed after {TIMEOUT_JOB_SECS}s: job timed out",
                lambda j: (
                    j["status"] == "failed"
                    and j.get("exit_code") == -1
                    and j.get("stderr") == TIMED_OUT_STDERR
                ),
            ),
            command="sleep 30",
            timeout_secs=TIMEOUT_JOB_SECS,
        )
        self.submit(
            Shown(
                "avoids drained node",
                f"done, on a node other than {drained}",
                lambda j: j["status"] == "done" and j["node_id"] != drained,
            ),
            command='echo "ran on $TINY_NODE_ID"',
        )
        self.follow(
            lambda: cancelled.job["status"] == "running" and _read_pid(pid_file) is not None
        )
        pid = _read_pid(pid_file)
        cancelled.job = self.client.cancel(cancelled.job_id)
        self._last_seen[cancelled.job_id] = job_state(cancelled.job)
        self.say(
            f"  cancelled {cancelled.job_id} while it ran (pid {pid}): its agent stops it"
            " when its next heartbeat is answered"
        )
        self.follow(lambda: all(settled(s.job) for s in self.shown) and not _alive(pid))
        cancelled.note_ok = pid is not None and not _alive(pid)
        cancelled.note = f"pid {pid} {'stopped' if cancelled.note_ok else 'STILL RUNNING'}"
        self.client.json("PATCH", f"/nodes/{drained}", json={"drain": False})
        self.say(f"  undrained {drained}")

    def phase_three(self) -> None:
        self.say("\n3) later and periodically: a delayed job and a schedule")
        delayed = self.submit(
            Shown(
                f"delayed {DELAY_SECS}s",
                "done, started no earlier than its not_before",
                _started_in_time,
            ),
            command='echo "ran at $(date -u +%T) on $TINY_NODE_ID"',
            delay_secs=DELAY_SECS,
        )
        self.say(
            f"  {delayed.job_id} is pending until {delayed.job['not_before']}:"
            " no agent is handed it before then"
        )
        schedule = self.client.json(
            "POST",
            "/schedules",
            json={"name": "demo-every-minute", "cron": "* * * * *", "job": {"command": "date"}},
        )
        # A client of the scheduler: this machine's clock, the one the dev daemon runs on.
        wait = (parse_time(schedule["next_run_at"]) - time.time_ns() // 1000) / 1e6
        self.say(
            f"  schedule {schedule['schedule_id']} {schedule['name']} ({schedule['cron']}):"
            f" fires next at {schedule['next_run_at']}, in {wait:.0f}s,"
            " submitting its job like POST /jobs with schedule_id set"
        )
        self.follow(lambda: all(settled(s.job) for s in self.shown))

    # --- following jobs -----------------------------------------------------------------------

    def phase_four(self) -> None:
        self.say("\n4) an agent restarted while its job runs: the job goes on and ends once")
        survivor = self.submit(
            Shown(
                "outlives its agent",
                "done on its first attempt, all of its output kept",
                lambda j: j["retry_count"] == 0 and _done_with(j, "before\nafter"),
            ),
            command="echo before; sleep 3; echo after",
        )
        self.follow(lambda: survivor.job["status"] == "running")
        node = survivor.job["node_id"]
        self.cluster.crash_agent(node)
        self.say(
            f"  killed {node}'s agent (SIGKILL): its job runs on, owned by a process of its own"
        )
        self.cluster.start_agent(node)
        self.say(f"  started {node}'s agent again: it takes the job back")
        self.follow(lambda: settled(survivor.job))

    def phase_five(self) -> None:
        self.say("\n5) what a job needs, a sweep, and a hold")
        try:
            self.client.submit({"command": "make -j2", "cpus": 2})
            refusal = "accepted (it should not have been)"
        except ClientError as exc:
            refusal = exc.message
        self.say(f"  a job asking for 2 CPUs on nodes of 1: {refusal}")
        pinned = self.submit(
            Shown(
                "pinned to node-2",
                "done, on node-2 (its node_ids)",
                lambda j: j["status"] == "done" and j["node_id"] == "node-2",
            ),
            command='echo "ran on $TINY_NODE_ID"',
            node_ids=["node-2"],
        )
        pinned.note_ok = refusal.startswith("no node can run this job")
        pinned.note = "on node-2; a 2-CPU job " + ("refused" if pinned.note_ok else "ACCEPTED")
        first = self.client.submit({"command": 'echo "copy $TINY_ARRAY_INDEX"', "array": 3})
        copies = self.client.json("GET", "/jobs", params={"array_id": first["job_id"]})
        for copy in copies:
            index = copy["array_index"]
            shown = Shown(
                f"array copy {index}",
                f"done, printing copy {index}",
                lambda j, index=index: _done_with(j, f"copy {index}"),
                job=copy,
            )
            self.shown.append(shown)
            self._last_seen[shown.job_id] = job_state(copy)
        self.say(
            f"  submitted an array of 3 as {first['job_id']}: one request, one transaction,"
            f" copies {', '.join(copy['job_id'] for copy in copies)}"
        )
        held = self.submit(
            Shown("held, then released", "done after its release", lambda j: _done_with(j, "go")),
            command="echo go",
        )
        held.job = self.client.json("POST", f"/jobs/{held.job_id}/hold")
        self._last_seen[held.job_id] = job_state(held.job)
        self.say(f"  held {held.job_id}: it waits for `{held.job.get('waiting_for', '')}`")
        self.follow(lambda: all(settled(s.job) for s in self.shown if s is not held))
        held.job = self.client.json("POST", f"/jobs/{held.job_id}/release")
        self.say(f"  released {held.job_id}")
        self.follow(lambda: all(settled(s.job) for s in self.shown))

    def follow(self, until: Callable[[], bool]) -> None:
        """Print every change of the demo's jobs until `until()` holds (or the phase times out)."""
        deadline = time.monotonic() + PHASE_TIMEOUT_SECS
        while True:
            for shown in self.shown:
                if shown.job.get("status") not in FINAL_STATUSES:
                    shown.job = self.client.job(shown.job_id)
                self._report_change(shown)
            if until():
                return
            if time.monotonic() > deadline:
                self.say(f"  (stopped waiting after {PHASE_TIMEOUT_SECS:.0f}s)")
                return
            time.sleep(TRACK_INTERVAL_SECS)

    def _report_change(self, shown: Shown) -> None:
        job = shown.job
        state = job_state(job)
        before = self._last_seen.get(shown.job_id)
        if before == state:
            return
        self._last_seen[shown.job_id] = state
        text = describe(job)
        if before is not None and job["retry_count"] > before[2]:
            last = job["attempts"][-1]
            text = (
                f"failed on {last['node_id']} (exit {last.get('exit_code')}),"
                f" retry {job['retry_count']} -> {job['node_id']}"
            )
        elapsed = time.monotonic() - self.started
        self.say(f"  [{elapsed:5.1f}s] {shown.job_id:<7} {shown.label:<22} {text}")

    # --- the end ------------------------------------------------------------------------------

    def summary(self) -> None:
        rows = []
        for shown in self.shown:
            job = shown.job
            nodes = [a["node_id"] for a in job.get("attempts", [])] + [job["node_id"]]
            rows.append(
                (
                    shown.job_id,
                    shown.label,
                    job["status"],
                    str(job["exit_code"]) if "exit_code" in job else "-",
                    " -> ".join(nodes),
                    shown.note or _first_line(job),
                    "ok" if shown.ok else f"UNEXPECTED (wanted {shown.expected})",
                )
            )
        headers = ("JOB", "SHOWS", "STATUS", "EXIT", "NODES", "OUTPUT", "AS EXPECTED")
        self.say("\nsummary")
        self.say(format_table(headers, rows))


def _done_with(job: dict[str, Any], text: str) -> bool:
    return job["status"] == "done" and text in job.get("stdout", "")


def _started_in_time(job: dict[str, Any]) -> bool:
    return (
        job["status"] == "done"
        and "running_at" in job
        and parse_time(job["running_at"]) >= parse_time(job["not_before"])
    )


def _retried_elsewhere(job: dict[str, Any]) -> bool:
    attempts = job.get("attempts", [])
    return (
        job["status"] == "done"
        and len(attempts) == 1
        and attempts[0]["node_id"] != job["node_id"]
        and "second try worked" in job.get("stdout", "")
    )


def _read_pid(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int | None) -> bool:
    """Whether process `pid` still runs (a zombie, dead but not yet reaped, does not)."""
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().split(b")")[-1].split()[0] != b"Z"
    except OSError:
        return False


def _first_line(job: dict[str, Any]) -> str:
    for stream in ("stdout", "stderr"):
        text = job.get(stream, "").strip()
        if text:
            return text.splitlines()[0][:60]
    return ""


def _probe_service(port: int, timeout: float = 10.0) -> str:
    """Ask the service over HTTP, as a load balancer would; what it answered."""
    deadline = time.monotonic() + timeout
    error = ""
    while time.monotonic() < deadline:
        try:
            reply = requests.get(f"http://127.0.0.1:{port}/", timeout=2)
            return f"HTTP {reply.status_code} from 127.0.0.1:{port}"
        except requests.RequestException as exc:
            error = type(exc).__name__
        time.sleep(0.1)
    return f"no answer on port {port} ({error})"


def main() -> int:
    print("tiny-scheduler demo: 3 agents and the scheduler, its own node registry, all on loopback")
    config = ClusterConfig.quick(
        agents=3,
        # Whatever the shell holds, the demo runs the documented defaults with its peers off.
        scheduler_env={
            "MAX_JOB_RETRIES": "1",
            "MAX_JOBS_PER_NODE": "1",
            "SQS_URL": "",
            "SNS_URL": "",
        },
    )
    began = time.monotonic()
    try:
        with DevCluster(config) as cluster:
            print(
                f"cluster up in {time.monotonic() - began:.1f}s: scheduler {cluster.scheduler_url}"
            )
            demo = Demo(cluster)
            ok = demo.run()
            print("\nstopping the cluster…")
    except (ClusterError, ClientError) as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted; everything was stopped", file=sys.stderr)
        return 130
    took = time.monotonic() - began
    if ok:
        print(f"done in {took:.0f}s: every job ended as expected; the cluster is stopped.")
        print(
            "Next: `.venv/bin/tiny-scheduler dev`, and in another shell"
            " `.venv/bin/tiny-scheduler submit --wait 'echo hi'`."
        )
        return 0
    print(f"done in {took:.0f}s, but some jobs did not end as expected (see above).")
    return 1


if __name__ == "__main__":
    sys.exit(main())
