"""The agent: its threads, its slots, its reports, and its drain.

`Agent.run()` runs one node until `request_drain()` (the SIGTERM handler calls it), then
drains and returns. Its threads:

- heartbeat: `PUT /nodes/<node>` (see `heartbeat` and `beating`); obeys the reply's period and
  `stop` list. By default it waits for work (`wait_for_work`): the answer comes as soon as
  the scheduler has work for the node, and hands it out.
- poll (only with `--poll-secs`, or when the scheduler does not wait for work): every
  `poll_secs`, `GET /jobs?node_id=<node>&status=pending` read with the tiny-aws agent's strict
  parser.
- Either way each job handed out is claimed with the exact `RUNNING_UPDATE` PATCH and started
  only when that answers 2xx (`_take`). A job is claimed only when it fits in what the node
  has free (`resources.Ledger`: a `run` job takes `max(cpus, 1)` of the slots, a service
  none, both their memory and GPUs); one that does not stays pending, for the scheduler to
  offer again.
- one per job: starts it (`runner.Runner`), waits for it, reports it.
- output: about once a second, `POST /jobs/<id>/output` with what each running job printed
  since the last send; a 404/405/409 ends that for the job (a scheduler without the endpoint,
  or a job that is no longer running).
- spool: retries the final reports that no scheduler acknowledged yet, with backoff.

Each job is owned by a process of its own (`runner`, `owner`), not by the agent: a restarted
agent takes its running jobs back (`_adopt`), their live output going on and their ends
reported, and lists them in its first heartbeat (with their attempts), so none is taken for
lost. The **fence**: after every heartbeat the leader answers, the agent moves the node's
fence on by `fence_secs`; when no answer comes for that long (the node is cut off, or the
agent is dead or frozen), the jobs' owners stop them, so that the copy the scheduler then
starts elsewhere is the only one.

Each job runs within its limits where the machine allows (`cgroups`: a control group per job
attempt, detected once at start; the heartbeat's `enforcement` says which, or `none`).

Reports are never lost: a job's result (fsynced by its owner) stays in its folder until a
scheduler answers its report 2xx, or refuses it for good (4xx such as 409 `stale report`: the
job is no longer that attempt's). A report no scheduler takes at once is also written to the
spool (fsynced), as is one the agent made itself (a job that never started, or whose owner
died), which no folder holds; it is retried with backoff, across every URL, at once when a
scheduler answers again after an outage, and after a restart of the agent (from the spool, or
from the job's folder). Reports,
claims and live output name their attempt (`node_id`, `attempt`). An agent that cannot write
its spool, or whose spool is full, takes no new work and says why in its heartbeat.

SIGTERM detaches: no new claims, the jobs stay with their owners (a new agent takes them
back; without one, the fence stops them), and `run()` returns within seconds. With
`drain_on_exit` it drains instead: running jobs get `drain_secs` to finish, then are stopped
(SIGTERM to their group, SIGKILL after `kill_grace_secs`) and reported as failed; the reports
are flushed (what no scheduler takes stays in the spool for the next start).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import secrets
import shutil
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from ..domain.jobs import TIMED_OUT_STDERR, Reason, with_last_line
from . import cgroups, owner, resources
from .beating import Heartbeating
from .config import AgentConfig
from .dev_registry import DevRegistry
from .groups import Groups
from .heartbeat import agent_version
from .protocol import RUNNING_UPDATE, PolledJob, parse_poll_reply, report_update
from .reporting import BACKOFF_FIRST_SECS, Reporting
from .runner import NO_USAGE, Limits, Outcome, PrepareError, Runner, remove_folder
from .spawning import Spawner
from .spool import Report, Spool
from .wire import Unreachable, Wire

log = logging.getLogger("tiny_scheduler.agent")

FLUSH_SECS = 10.0
"""Seconds a draining agent spends on delivering its reports before it exits anyway (they
stay in the spool)."""

FLUSH_TIMEOUT = (2.0, 5.0)
"""(connect, read) seconds per call while flushing at exit."""

FENCE_FILE = "fence"
"""File in the work directory: the node's fence (`owner.write_node_fence`), which the agent
moves on after every heartbeat the leader answers, and every job's owner reads."""

AGENT_ID_FILE = "agent_id"
"""File in the work directory: this agent's id, the same across its restarts."""

DETACH_SECS = 5.0
"""Seconds a detaching agent spends on delivering the reports in hand before it exits."""


class Agent(Reporting, Heartbeating):
    """One node's agent: its threads and slots; reports (`Reporting`) and heartbeats
    (`Heartbeating`) are parts of their own."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        os.makedirs(config.work_dir, exist_ok=True)
        self.wire = Wire(config.urls, config.key)
        self.spool = Spool(config.spool_dir)
        self.groups = Groups(config.work_dir)
        self.spawner = Spawner(config.work_dir)  # starts and owns the jobs (from run() on)
        self.version = agent_version()
        self.registry = (
            DevRegistry(config.registry_url, config.node_id, config.slots, config.key)
            if config.registry_url
            else None
        )
        self._lock = threading.Lock()
        self._runners: dict[str, Runner] = {}
        self._held: dict[str, Report] = {}  # in the spool, not yet acknowledged
        self._next_try: dict[str, float] = {}  # monotonic time of the next try; inf: in hand
        self._delay: dict[str, float] = {}
        self._in_flight: set[str] = set()
        self._draining = threading.Event()
        self._done = threading.Event()
        self._spool_wake = threading.Event()
        self._reachable = True
        self._beaten = threading.Event()  # a heartbeat was answered since start or outage
        self._beat_lock = threading.Lock()
        self._heartbeat_secs = config.heartbeat_secs
        self._heartbeats_unsupported = False
        self._poll_status = 200  # the poll's last answer, to log changes only
        self._drain_flag = False  # the last heartbeat reply's `drain`
        self._job_threads: list[threading.Thread] = []
        self._threads: list[threading.Thread] = []
        self._poller: threading.Thread | None = None
        self._taking = threading.Lock()  # held while handed-out jobs are claimed and started
        self._period_known = False  # a heartbeat answer gave the scheduler's period
        self._parent = os.getppid() if config.exit_with_parent else None
        self.agent_id = _agent_id(config.work_dir)
        self._fence_secs: float | None = None  # known once a heartbeat answer says enough
        self._fence_deadline: float | None = None  # monotonic; None: no fence (yet)
        self._job_timeout_secs = 0.0  # JOB_TIMEOUT_SECS, as the scheduler's answer says
        self._spool_fault = ""  # why the spool cannot be written, while it cannot
        self._other_agent = ""  # the scheduler's 409: another agent serves this node
        self._beat_status = 200  # the heartbeat's last answer, to log changes only
        self.fatal = ""  # set when the agent must exit (and say why)
        self._scheduler_fences = False  # its heartbeat answers say so (node_lost_secs)
        self.capacity = resources.Capacity(
            cpus=config.slots,
            memory_mb=resources.detect_memory_mb()
            if config.memory_mb is None
            else config.memory_mb,
            gpus=resources.detect_gpus() if config.gpus is None else config.gpus,
            labels=config.labels,
        )
        self.ledger = resources.Ledger(self.capacity)  # under self._lock
        self._unfit: set[str] = set()  # polled jobs said not to fit (said once each)
        self.fence_file = os.path.join(config.work_dir, FENCE_FILE)
        self.limits, self.enforcement = self._enforcement()

    def _enforcement(self) -> tuple[Limits, str]:
        """What this node enforces: the layout of its jobs' control groups, or none."""
        prefix = f"tiny-scheduler.{self.agent_id}."
        if not self.config.enforce:
            log.info("enforcement: none (--enforcement none)")
            return Limits(None, prefix, self.capacity.gpus, self.fence_file), cgroups.NONE
        layout, why = cgroups.detect(prefix + "probe")
        if layout is None:
            log.warning("enforcement: none: %s; jobs run without limits", why)
            return Limits(None, prefix, self.capacity.gpus, self.fence_file), cgroups.NONE
        log.info("enforcement: %s (%s)", layout.version, layout.describe())
        return Limits(layout, prefix, self.capacity.gpus, self.fence_file), layout.version

    # --- lifecycle --------------------------------------------------------------------------

    def run(self) -> None:
        """Run until asked to stop, then detach (or drain); returns when the agent is done."""
        for report in self.spool.entries():
            self._hold(report, next_try=0.0)
        if self._held:
            log.info("%d reports in the spool from an earlier run", len(self._held))
        self._adopt()
        self._remove_leftover_groups()
        self.spawner.start()
        capacity = self.capacity
        log.info(
            "%s: %d slots, %s %s; %s MiB, %d GPUs%s",
            self.config.node_id,
            self.config.slots,
            "waiting for work at" if self.config.wait_for_work else "polling",
            ",".join(self.config.urls)
            + ("" if self.config.wait_for_work else f" every {self.config.poll_secs:g}s"),
            capacity.memory_mb or "unknown",
            capacity.gpus,
            "".join(f", {key}={value}" for key, value in capacity.labels),
        )
        if not self.config.wait_for_work:
            self._poller = self._spawn(self._poll_loop, "poll")
        self._spawn(self._heartbeat_loop, "heartbeat")
        self._spawn(self._output_loop, "output")
        self._spawn(self._spool_loop, "spool")
        if self.registry is not None:
            self._spawn(self._registry_loop, "registry")
        drain = self.config.drain_on_exit
        while not self._draining.wait(1.0):
            if self._parent is not None and os.getppid() != self._parent:
                log.warning("the process that started the agent is gone: draining")
                drain = True
                self._draining.set()
        if drain and not self.fatal:
            self._drain()
        else:
            self._detach()

    def request_drain(self) -> None:
        """Ask the agent to end (SIGTERM): it detaches from its jobs, or drains them with
        `drain_on_exit`; safe in a signal handler (it only sets a flag)."""
        self._draining.set()

    def _adopt(self) -> None:
        """Take back the jobs an earlier run of this agent started: each job folder holds a
        job whose owner still runs it, or has left its result, or died before it could. Of
        one job's attempts only the latest counts (the scheduler gave the others up): a
        report of an earlier one, spooled or in a folder, is dropped, and so is its folder
        (a copy of it still running is stopped first)."""
        jobs_dir = os.path.join(self.config.work_dir, "jobs")
        if not os.path.isdir(jobs_dir):
            return
        spooled = {report.folder for report in self._held.values() if report.folder}
        latest: dict[str, Runner] = {}
        for name in sorted(os.listdir(jobs_dir)):
            folder = os.path.join(jobs_dir, name)
            if folder in spooled or not os.path.isdir(folder):
                continue
            runner = Runner.adopt(
                folder, self.config.node_id, self.groups, self.config.max_output_bytes
            )
            if runner is None:
                shutil.rmtree(folder, ignore_errors=True)  # never started: no spec, no result
                continue
            other = latest.get(runner.job_id)
            if other is not None and _attempt_order(other.attempt) > _attempt_order(runner.attempt):
                runner, other = other, runner
            latest[runner.job_id] = runner
            if other is not None:
                self._drop_earlier_attempt(other)
        taken = 0
        for runner in latest.values():
            held = self._held.get(runner.job_id)
            if held is not None:
                if _attempt_order(held.retry_count) >= _attempt_order(runner.attempt):
                    self._drop_earlier_attempt(runner)  # the spool has this one's, or later
                    continue
                log.warning("%s: a spooled report of an earlier attempt is dropped", held.job_id)
                self._settle(held)
            with self._lock:
                self._runners[runner.job_id] = runner
                self.ledger.restore(runner.job_id, runner.grant)
            self._job_thread(runner, runner.attempt, adopted=True)
            taken += 1
        if taken:
            log.info("took back %d jobs an earlier run of this agent started", taken)

    def _drop_earlier_attempt(self, runner: Runner) -> None:
        """An earlier attempt's folder, when a later one of the same job is known: a copy of
        it still running is stopped (its folder then stays, for the next start to remove),
        an ended one's folder goes."""
        if runner.ended:
            remove_folder(runner.folder)
        else:
            log.warning("%s: stopping a copy of an earlier attempt", runner.job_id)
            runner.stop(note="\n[tiny-scheduler agent: stopped: a later attempt is known]\n")

    def _remove_leftover_groups(self) -> None:
        """Remove the control groups of this agent's jobs whose folders are gone (an owner
        killed with SIGKILL leaves its job's group behind), and whatever still runs in them."""
        layout = self.limits.layout
        if layout is None:
            return
        jobs_dir = os.path.join(self.config.work_dir, "jobs")
        live = os.listdir(jobs_dir) if os.path.isdir(jobs_dir) else []
        for group in cgroups.leftovers(layout, self.limits.group_prefix, live):
            if group.kill_all(seconds=1.0) and group.remove():
                log.info("removed the leftover cgroup %s", group.paths()[0])

    def _detach(self) -> None:
        """End the agent, leaving the running jobs to their owners."""
        self._wait_for_takers()  # a claim under way starts its job before we go
        left = len(self._live())
        self._done.set()
        self._spool_wake.set()
        for thread in self._threads:
            thread.join(DETACH_SECS)
        self._flush(DETACH_SECS)
        self.wire.close()
        self.spawner.close()
        log.info(
            "stopped; %d jobs left running with their owners (the next agent takes them "
            "back; without one, they stop at the fence)",
            left,
        )

    def _drain(self) -> None:
        # The poll loop ends at the flag; a claim it had under way when the flag came must
        # have started its job before the jobs are counted, or that job would run on unseen.
        self._wait_for_takers()
        log.info("draining: no new jobs; %d running", len(self._live()))
        deadline = time.monotonic() + self.config.drain_secs
        while self._live() and time.monotonic() < deadline:
            time.sleep(0.05)
        left = self._live()
        for runner in left:
            runner.stop(
                note=(
                    "\n[tiny-scheduler agent: stopped while draining, after "
                    f"{self.config.drain_secs:g}s]\n"
                ),
            )
        if left:
            log.info("draining: stopped %d jobs that were still running", len(left))
        for thread in list(self._job_threads):
            thread.join()  # each ends after its job's first report try
        self._done.set()
        self._spool_wake.set()
        for thread in self._threads:
            thread.join()
        self._flush(FLUSH_SECS)
        self.wire.close()
        self.spawner.close()
        with self._lock:
            kept = len(self._held)
        log.info("stopped; %d reports left in the spool", kept)

    def _wait_for_takers(self) -> None:
        """Once draining: the poll loop has ended, and the jobs being taken have started."""
        if self._poller is not None:
            self._poller.join()
        with self._taking:
            pass  # from now on, `_take` starts nothing (it looks at the flag in here)

    def _flush(self, seconds: float) -> None:
        """Try once to deliver each report in hand, for at most `seconds`."""
        deadline = time.monotonic() + seconds
        with self._lock:
            reports = list(self._held.values())
        for report in reports:
            if time.monotonic() > deadline:
                break
            self._deliver(report, check=True, timeout=FLUSH_TIMEOUT)

    def _spawn(self, target: Callable[..., None], name: str, *args: Any) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)
        return thread

    def _live(self) -> list[Runner]:
        with self._lock:
            return list(self._runners.values())

    def running_ids(self) -> set[str]:
        """The jobs whose outcome this node holds: live ones, and reports not yet taken."""
        return set(self.running_attempts())

    def running_attempts(self) -> dict[str, int | None]:
        """The jobs whose outcome this node holds, each with its attempt (when known)."""
        with self._lock:
            found = {job_id: report.retry_count for job_id, report in self._held.items()}
            found.update({job_id: r.attempt for job_id, r in self._runners.items()})
        return found

    def refusing_work(self) -> str:
        """Why this agent takes no new work now ("" when it does): a promise it could not
        keep (its spool cannot be written, or is full)."""
        if self._spool_fault:
            return f"spool not writable: {self._spool_fault}"
        files, size = self.spool.usage()
        if files >= self.config.spool_max_files:
            return f"spool full: {files} files"
        if size >= self.config.spool_max_bytes:
            return f"spool full: {size} bytes"
        return ""

    def _note_reach(self, reached: bool) -> None:
        """Track whether a scheduler answers; when one does again, retry reports at once."""
        if not reached:
            self._beaten.clear()
        with self._lock:
            was, self._reachable = self._reachable, reached
            if reached and not was:
                now = time.monotonic()
                for job_id, when in self._next_try.items():
                    if when != math.inf:
                        self._next_try[job_id] = min(when, now)
                        self._delay[job_id] = BACKOFF_FIRST_SECS
        if reached and not was:
            log.info("a scheduler answers again")
            self._spool_wake.set()
        elif was and not reached:
            log.warning("no scheduler answers at %s", ",".join(self.config.urls))

    # --- poll and claim ---------------------------------------------------------------------

    def _poll_loop(self) -> None:
        while not self._draining.is_set():
            try:
                self.poll_once()
            except Exception:
                # One bad round (a full disk for a scratch dir, say) must not end the node.
                log.exception("poll round failed")
            self._draining.wait(self.config.poll_secs)

    def poll_once(self) -> None:
        # A poll without a key from a node whose heartbeat the scheduler has not seen passes
        # for the tiny-aws agent's, which polls only when idle: the scheduler takes it as
        # proof that the node runs none of its jobs and fails them as lost. So the first poll,
        # and the first after an outage (a scheduler restarted meanwhile knows nothing of this
        # node), comes after a heartbeat that was answered.
        if not self._beaten.is_set() and not self.heartbeat_once():
            return
        if self._other_agent or self.refusing_work():
            return  # another agent serves this node, or this one cannot keep its promises
        params = {"node_id": self.config.node_id, "status": "pending"}
        try:
            reply = self.wire.call("GET", "/jobs", params=params)
        except Unreachable:
            self._note_reach(False)
            return
        self._note_reach(True)
        if reply.status_code != self._poll_status:
            # Said once per change: a wrong key (401) would otherwise fail silently, and
            # repeating it every poll would drown the log.
            if reply.status_code != 200:
                log.warning("poll answered %d: %s", reply.status_code, reply.text.strip()[:200])
            elif self._poll_status:
                log.info("poll answers 200 again")
            self._poll_status = reply.status_code
        if reply.status_code != 200:
            return
        try:
            polled = parse_poll_reply(reply.content)
        except ValueError as exc:
            # As the tiny-aws agent: an unreadable reply means doing nothing this round.
            log.warning("unreadable poll reply: %s", exc)
            return
        self._take(polled)

    def _take(self, polled: list[PolledJob]) -> int:
        """Claim and start, one by one, the jobs a poll or a waiting heartbeat handed out
        that fit in what is free; how many started. Only one thread takes at a time: the
        poll's, or the heartbeat's (`_taking`, which a drain waits for)."""
        with self._taking:
            with self._lock:
                known = set(self._runners)
            self._unfit &= {job.job_id for job in polled}
            started = 0
            for job in polled:
                if self._draining.is_set():
                    break
                if job.job_id in known:
                    continue
                if self._take_one(job):
                    started += 1
            return started

    def _take_one(self, job: PolledJob) -> bool:
        # Held before the claim (the claim may fail): a job that does not fit in what is free
        # now is left pending, however the scheduler counts, and offered again.
        need = resources.Need.of(job.cpus, job.memory_mb, job.gpus, job.job_type == "service")
        with self._lock:
            grant = self.ledger.take(job.job_id, need)
            short = "" if grant is not None else self.ledger.shortfall(need)
        if grant is None:
            if job.job_id not in self._unfit:
                self._unfit.add(job.job_id)
                log.info("%s does not fit now (needs %s): left pending", job.job_id, short)
            return False
        claimed = self._claim(job)
        if claimed is None:
            with self._lock:
                self.ledger.give_back(job.job_id)
            return False
        try:
            self._start(job, claimed, grant)
        except BaseException:
            with self._lock:  # no folder for it (a full disk): nothing of it runs
                if job.job_id not in self._runners:
                    self.ledger.give_back(job.job_id)
            raise
        return True

    def free_slots(self) -> int:
        """The slots a waiting heartbeat asks work for: the CPUs free now, none while the
        agent takes no new work (draining, another agent serves the node, its spool)."""
        if self._draining.is_set() or self._other_agent or self.refusing_work():
            return 0
        with self._lock:
            return max(0, self.ledger.free().cpus)

    def _fall_back_to_polling(self) -> None:
        """The scheduler does not hand work out in heartbeats: poll for it instead."""
        if self._poller is None:
            self._poller = self._spawn(self._poll_loop, "poll")

    def _claim(self, job: PolledJob) -> dict[str, Any] | None:
        """PATCH running; the job as the scheduler answered, or None when not claimed."""
        body = {**RUNNING_UPDATE, **self._names(job.retry_count)}
        try:
            reply = self.wire.call("PATCH", f"/jobs/{quote(job.job_id)}", json=body)
        except Unreachable:
            self._note_reach(False)
            return None
        if not reply.ok:
            log.info("claim of %s answered %d: not run", job.job_id, reply.status_code)
            return None
        try:
            answer = json.loads(reply.content)
        except ValueError:
            answer = None
        return answer if isinstance(answer, dict) else {}

    def _start(self, job: PolledJob, claimed: dict[str, Any], grant: resources.Grant) -> None:
        with self._lock:
            stale = self._held.pop(job.job_id, None)
            self._next_try.pop(job.job_id, None)
        if stale is not None or self.spool.has(job.job_id):
            # The scheduler let this job run again, so it ended the attempt that report was
            # about some other way (lost node): that report must not pass for this one's,
            # neither from the spool nor from its folder at the agent's next start.
            log.warning("%s claimed again: its earlier report is dropped", job.job_id)
            self.spool.remove(job.job_id)
            if stale is not None and stale.folder:
                remove_folder(stale.folder)
        retry_count = claimed.get("retry_count")
        attempt = retry_count if isinstance(retry_count, int) else job.retry_count
        with self._lock:
            running = len(self._runners)
        owner.raise_open_files(running + 256)  # a descriptor per running job, waited on
        runner = Runner.new(
            job,
            attempt,
            self.config.node_id,
            self.config.work_dir,
            self.groups,
            self.config.max_output_bytes,
            grant,
        )
        with self._lock:
            self._runners[job.job_id] = runner
        log.info("claimed %s (%s)", job.job_id, job.job_type or "run")
        self._job_thread(runner, attempt, adopted=False)

    def _job_thread(self, runner: Runner, attempt: int | None, adopted: bool) -> None:
        thread = threading.Thread(
            target=self._run_job, args=(runner, attempt, adopted), name=runner.job_id, daemon=True
        )
        self._job_threads = [t for t in self._job_threads if t.is_alive()]
        self._job_threads.append(thread)
        thread.start()

    def _names(self, attempt: int | None) -> dict[str, Any]:
        """What names an attempt in a report: this node, and the attempt when known."""
        names: dict[str, Any] = {"node_id": self.config.node_id}
        if attempt is not None:
            names["attempt"] = attempt
        return names

    # --- running and reporting --------------------------------------------------------------

    def _run_job(self, runner: Runner, attempt: int | None, adopted: bool) -> None:
        outages_at_claim = self.wire.outages
        if adopted:
            outcome = runner.wait()
        else:
            timeout = runner.job.timeout_secs or self._job_timeout_secs
            try:
                runner.start(
                    timeout,
                    self.config.kill_grace_secs,
                    self._fence_deadline,
                    self.limits,
                    self.spawner,
                )
            except PrepareError as exc:
                outcome = Outcome(-1, stderr=str(exc))
            except OSError as exc:
                outcome = Outcome(-1, stderr=f"start failed: {exc}")
            else:
                if runner.is_service and self.registry is not None:
                    self.registry.register_service(runner.job_id, runner.job.port)
                outcome = runner.wait()
        if runner.live_output and (runner.stdout.sent or runner.stderr.sent):
            # What came since the last send, before the report. A job that never sent any
            # sends none: the report carries all of it.
            self._send_output(runner)
        body = {**report_update(outcome.exit_code, outcome.stdout, outcome.stderr)}
        if outcome.why == "timeout":
            # Stopped at its timeout where it ran: final, as the scheduler's own timeout is.
            body.update(status="failed", exit_code=-1, reason="timeout")
            body["stderr"] = with_last_line(body["stderr"], TIMED_OUT_STDERR)
        elif outcome.why == "out_of_memory":
            # Its group's OOM-kill count rose: final too (the scheduler adds the last line).
            body.update(status="failed", reason=Reason.OUT_OF_MEMORY.value)
        body.update(self._names(attempt))
        body["usage"] = outcome.usage or NO_USAGE
        report = Report(runner.job_id, body, attempt, runner.folder)
        if not outcome.kept:
            # Its folder does not hold it: the spool keeps it until a scheduler has it. One
            # that its folder holds is spooled only when no scheduler takes it at once
            # (`_later`); after a crash it is reported from its folder (`_adopt`).
            self._spool(report)
        # Held before the runner goes, so that every heartbeat lists the job one way or the
        # other until a scheduler has its report.
        self._hold(report, next_try=math.inf)
        with self._lock:
            self._runners.pop(runner.job_id, None)
            self.ledger.give_back(runner.job_id)
        log.info(
            "%s ended: %s, exit %d%s",
            runner.job_id,
            body["status"],
            outcome.exit_code,
            "" if outcome.why == "exit" else f" ({outcome.why})",
        )
        # A scheduler out of reach while the job ran may have given it up meanwhile.
        self._deliver(report, check=adopted or self.wire.outages != outages_at_claim)

    # --- heartbeat, stop orders, live output ------------------------------------------------

    def _registry_loop(self) -> None:
        assert self.registry is not None
        while not self._done.is_set():
            self.registry.heartbeat()
            self._done.wait(self.config.registry_heartbeat_secs)


def _attempt_order(attempt: int | None) -> int:
    """Attempts in the order they were made; one of unknown number (a scheduler that does not
    say) before any numbered one."""
    return -1 if attempt is None else attempt


def _agent_id(work_dir: str) -> str:
    """This agent's id: random, made once and kept in its work directory, so a restart is
    the same agent to the scheduler and a second agent on the node id is another."""
    path = os.path.join(work_dir, AGENT_ID_FILE)
    try:
        with open(path) as f:
            found = f.read().strip()
        if found:
            return found
    except OSError:
        pass
    made = secrets.token_hex(8)
    with contextlib.suppress(OSError):
        with open(path + ".tmp", "w") as f:
            f.write(made)
        os.replace(path + ".tmp", path)
    return made
