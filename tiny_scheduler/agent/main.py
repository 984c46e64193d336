"""The agent: its threads, its slots, its reports, and its drain.

`Agent.run()` runs one node until `request_drain()` (the SIGTERM handler calls it), then
drains and returns. Its threads:

- poll: every `poll_secs`, `GET /jobs?node_id=<node>&status=pending` read with the tiny-aws
  agent's strict parser; each job is claimed with the exact `RUNNING_UPDATE` PATCH and started
  only when that answers 2xx. `run` jobs take a slot each, up to `slots`; `service` jobs take
  none, as on the scheduler's side.
- one per job: starts it (`runner.Runner`), waits for it, reports it.
- heartbeat: `PUT /nodes/<node>` (see `heartbeat`); obeys the reply's period and `stop` list.
- output: about once a second, `POST /jobs/<id>/output` with what each running job printed
  since the last send; a 404/405/409 ends that for the job (a scheduler without the endpoint,
  or a job that is no longer running).
- spool: retries the final reports that no scheduler acknowledged yet, with backoff.

Reports are never lost: each final report is written to the spool (fsynced) before it is
sent, and removed once a scheduler answers it 2xx, or refuses it for good (4xx such as 409:
the job is no longer that attempt's). Otherwise it is retried with backoff, across every URL,
at once when a scheduler answers again after an outage, and after a restart of the agent.
Before a report that waited (or whose job ran through an outage) is sent, the job is looked
up: a report that the scheduler has since replaced by another attempt (it gave the job up as
lost and ran it again) is dropped instead of being taken for the new attempt's outcome.

Drain (SIGTERM): no new claims; running jobs get `drain_secs` to finish, then are stopped
(SIGTERM to their group, SIGKILL after `kill_grace_secs`) and reported as failed; the reports
are flushed (what no scheduler takes stays in the spool for the next start); then `run()`
returns.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from ..dev.agent_protocol import RUNNING_UPDATE, PolledJob, parse_poll_reply, report_update
from .config import AgentConfig
from .dev_registry import DevRegistry
from .groups import Groups, kill_recorded_children
from .heartbeat import Beat, agent_version, beat
from .runner import Outcome, PrepareError, Runner
from .spool import Report, Spool
from .wire import Unreachable, Wire

log = logging.getLogger("tiny_scheduler.agent")

OUTPUT_SECS = 1.0
"""Seconds between two sends of a running job's new output."""

BACKOFF_FIRST_SECS = 0.5
BACKOFF_MAX_SECS = 30.0
"""A report no scheduler took is tried again after 0.5 s, then twice as long each time, up
to this."""

FLUSH_SECS = 10.0
"""Seconds a draining agent spends on delivering its reports before it exits anyway (they
stay in the spool)."""

FLUSH_TIMEOUT = (2.0, 5.0)
"""(connect, read) seconds per call while flushing at exit."""

REFUSED_FOR_GOOD = frozenset({400, 404, 409, 410, 413, 422})
"""Answers to a final report that no retry would change: the report is dropped."""


class Agent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        os.makedirs(config.work_dir, exist_ok=True)
        self.wire = Wire(config.urls, config.key)
        self.spool = Spool(config.spool_dir)
        self.groups = Groups(config.work_dir)
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
        self._parent = os.getppid() if config.exit_with_parent else None

    # --- lifecycle --------------------------------------------------------------------------

    def run(self) -> None:
        """Run until a drain is asked for, then drain; returns when the agent is done."""
        leftovers = kill_recorded_children(self.config.work_dir, only_inside=True)
        if leftovers:
            # An earlier run of this agent died without stopping its jobs; nobody will report
            # them, so they must not run on unseen (the scheduler gives them up as lost).
            log.warning("killed %d job process groups left by an earlier run", len(leftovers))
        for report in self.spool.entries():
            self._hold(report, next_try=0.0)
        if self._held:
            log.info("%d reports in the spool from an earlier run", len(self._held))
        log.info(
            "%s: %d slots, polling %s every %gs",
            self.config.node_id,
            self.config.slots,
            ",".join(self.config.urls),
            self.config.poll_secs,
        )
        self._poller = self._spawn(self._poll_loop, "poll")
        self._spawn(self._heartbeat_loop, "heartbeat")
        self._spawn(self._output_loop, "output")
        self._spawn(self._spool_loop, "spool")
        if self.registry is not None:
            self._spawn(self._registry_loop, "registry")
        while not self._draining.wait(1.0):
            if self._parent is not None and os.getppid() != self._parent:
                log.warning("the process that started the agent is gone: draining")
                self._draining.set()
        self._drain()

    def request_drain(self) -> None:
        """Ask the agent to drain and end; safe in a signal handler (it only sets a flag)."""
        self._draining.set()

    def _drain(self) -> None:
        # The poll loop ends at the flag; a claim it had under way when the flag came must
        # have started its job before the jobs are counted, or that job would run on unseen.
        if self._poller is not None:
            self._poller.join()
        log.info("draining: no new jobs; %d running", len(self._live()))
        deadline = time.monotonic() + self.config.drain_secs
        while self._live() and time.monotonic() < deadline:
            time.sleep(0.05)
        left = self._live()
        for runner in left:
            runner.stop(
                self.config.kill_grace_secs,
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
        self._flush()
        self.wire.close()
        with self._lock:
            kept = len(self._held)
        log.info("stopped; %d reports left in the spool", kept)

    def _flush(self) -> None:
        deadline = time.monotonic() + FLUSH_SECS
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
        with self._lock:
            return set(self._runners) | set(self._held)

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
        with self._lock:
            busy = sum(1 for r in self._runners.values() if not r.is_service)
            known = set(self._runners)
        free = self.config.slots - busy
        for job in polled:
            if self._draining.is_set():
                return
            is_service = job.job_type == "service"
            if job.job_id in known or (not is_service and free <= 0):
                continue
            claimed = self._claim(job)
            if claimed is None:
                continue
            if not is_service:
                free -= 1
            self._start(job, claimed)

    def _claim(self, job: PolledJob) -> dict[str, Any] | None:
        """PATCH running; the job as the scheduler answered, or None when not claimed."""
        try:
            reply = self.wire.call("PATCH", f"/jobs/{quote(job.job_id)}", json=RUNNING_UPDATE)
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

    def _start(self, job: PolledJob, claimed: dict[str, Any]) -> None:
        with self._lock:
            stale = self._held.pop(job.job_id, None)
            self._next_try.pop(job.job_id, None)
        if stale is not None or self.spool.has(job.job_id):
            # The scheduler let this job run again, so it ended the attempt that report was
            # about some other way (lost node): that report must not pass for this one's.
            log.warning("%s claimed again: its earlier spooled report is dropped", job.job_id)
            self.spool.remove(job.job_id)
        retry_count = claimed.get("retry_count")
        runner = Runner(
            job,
            self.config.node_id,
            self.config.work_dir,
            self.groups,
            self.config.max_output_bytes,
        )
        with self._lock:
            self._runners[job.job_id] = runner
        log.info("claimed %s (%s)", job.job_id, job.job_type or "run")
        thread = threading.Thread(
            target=self._run_job,
            args=(runner, retry_count if isinstance(retry_count, int) else None),
            name=job.job_id,
            daemon=True,
        )
        self._job_threads = [t for t in self._job_threads if t.is_alive()]
        self._job_threads.append(thread)
        thread.start()

    # --- running and reporting --------------------------------------------------------------

    def _run_job(self, runner: Runner, retry_count: int | None) -> None:
        outages_at_claim = self.wire.outages
        try:
            runner.start()
        except PrepareError as exc:
            outcome = Outcome(-1, stderr=str(exc))
        except OSError as exc:
            outcome = Outcome(-1, stderr=f"start failed: {exc}")
        else:
            if runner.is_service and self.registry is not None:
                self.registry.register_service(runner.job_id, runner.job.port)
            outcome = runner.wait()
        body = report_update(outcome.exit_code, outcome.stdout, outcome.stderr)
        report = Report(runner.job_id, body, retry_count)
        try:
            self.spool.put(report)
        except OSError as exc:
            log.error("cannot spool the report of %s (%s): sending it anyway", runner.job_id, exc)
        # Held before the runner goes, so that every heartbeat lists the job one way or the
        # other until a scheduler has its report.
        self._hold(report, next_try=math.inf)
        with self._lock:
            self._runners.pop(runner.job_id, None)
        runner.cleanup()
        log.info("%s ended: %s, exit %d", runner.job_id, body["status"], outcome.exit_code)
        # A scheduler out of reach while the job ran may have given it up meanwhile.
        self._deliver(report, check=self.wire.outages != outages_at_claim)

    def _hold(self, report: Report, next_try: float) -> None:
        with self._lock:
            self._held[report.job_id] = report
            self._next_try[report.job_id] = next_try
            self._delay.setdefault(report.job_id, BACKOFF_FIRST_SECS)

    def _deliver(
        self, report: Report, check: bool, timeout: tuple[float, float] | None = None
    ) -> bool:
        """Try once to have a scheduler take `report`; whether it is settled (taken, refused
        for good, or no longer wanted). An unsettled report is tried again later."""
        job_id = report.job_id
        with self._lock:
            if job_id in self._in_flight or self._held.get(job_id) is not report:
                return False
            self._in_flight.add(job_id)
        kwargs: dict[str, Any] = {"timeout": timeout} if timeout else {}
        try:
            if check and not self._still_wanted(report, kwargs):
                log.warning("%s: the scheduler has moved on; its report is dropped", job_id)
                self._settle(report)
                return True
            reply = self.wire.call("PATCH", f"/jobs/{quote(job_id)}", json=report.body, **kwargs)
        except Unreachable:
            self._note_reach(False)
            self._later(report)
            return False
        finally:
            with self._lock:
                self._in_flight.discard(job_id)
        self._note_reach(True)
        if reply.ok:
            self._settle(report)
            log.info("%s reported %s", job_id, report.body["status"])
            return True
        if reply.status_code in REFUSED_FOR_GOOD:
            log.warning(
                "%s: report refused with %d (%s); dropped",
                job_id,
                reply.status_code,
                reply.text.strip()[:200],
            )
            self._settle(report)
            return True
        log.warning("%s: report answered %d; will retry", job_id, reply.status_code)
        self._later(report)
        return False

    def _still_wanted(self, report: Report, kwargs: dict[str, Any]) -> bool:
        """Whether the scheduler still waits for this attempt's outcome: the job is running
        on this node in the same attempt, or ended by timeout or cancel during it (the late
        report). Raises Unreachable when no scheduler answers."""
        reply = self.wire.call("GET", f"/jobs/{quote(report.job_id)}", **kwargs)
        if reply.status_code == 404:
            return False
        if not reply.ok:
            return True  # cannot tell (no key for the lookup, say): the PATCH will
        try:
            job = json.loads(reply.content)
        except ValueError:
            return True
        if not isinstance(job, dict):
            return True
        same = job.get("node_id") == self.config.node_id and (
            report.retry_count is None or job.get("retry_count") == report.retry_count
        )
        late = job.get("status") == "failed" and job.get("reason") in ("timeout", "cancelled")
        return same and (job.get("status") == "running" or late)

    def _settle(self, report: Report) -> None:
        self.spool.remove(report.job_id)
        with self._lock:
            if self._held.get(report.job_id) is report:
                del self._held[report.job_id]
                self._next_try.pop(report.job_id, None)
                self._delay.pop(report.job_id, None)

    def _later(self, report: Report) -> None:
        with self._lock:
            if self._held.get(report.job_id) is not report:
                return
            delay = self._delay.get(report.job_id, BACKOFF_FIRST_SECS)
            self._next_try[report.job_id] = time.monotonic() + delay
            self._delay[report.job_id] = min(delay * 2, BACKOFF_MAX_SECS)

    def _spool_loop(self) -> None:
        while not self._done.is_set():
            now = time.monotonic()
            with self._lock:
                due = [self._held[j] for j, when in self._next_try.items() if when <= now]
                upcoming = [w for w in self._next_try.values() if w > now and w != math.inf]
            for report in due:
                if self._done.is_set():
                    return
                self._deliver(report, check=True)
            wait = min([*(w - time.monotonic() for w in upcoming), 1.0])
            self._spool_wake.wait(max(wait, 0.01))
            self._spool_wake.clear()

    # --- heartbeat, stop orders, live output ------------------------------------------------

    def _heartbeat_loop(self) -> None:
        while not self._done.is_set():
            self.heartbeat_once()
            self._done.wait(self._heartbeat_secs)

    def heartbeat_once(self) -> bool:
        """Send one heartbeat and act on its reply; whether a scheduler answered it."""
        with self._beat_lock:
            result = beat(
                self.wire, self.config.node_id, self.config.slots, self.running_ids(), self.version
            )
            self._on_beat(result)
            if result.answered:
                self._beaten.set()
            return result.answered

    def _on_beat(self, result: Beat) -> None:
        if not result.answered:
            self._note_reach(False)
        elif not result.supported:
            self._note_reach(True)
            if not self._heartbeats_unsupported:
                log.info(
                    "the scheduler has no heartbeat endpoint (%d); polling on, and "
                    "trying the heartbeat again every %gs",
                    result.status,
                    self._heartbeat_secs,
                )
            self._heartbeats_unsupported = True
        elif result.status // 100 == 2:
            self._note_reach(True)
            self._heartbeats_unsupported = False
            if result.heartbeat_secs:
                self._heartbeat_secs = result.heartbeat_secs
            if result.drain != self._drain_flag:
                # The scheduler gives a draining node no new work; nothing to do here
                # but say so.
                self._drain_flag = result.drain
                log.info("the scheduler %s this node", "drains" if result.drain else "undrains")
            self._obey_stops(result.stop)
        else:
            log.debug("heartbeat answered %d", result.status)

    def _obey_stops(self, job_ids: tuple[str, ...]) -> None:
        with self._lock:
            runners = [self._runners[j] for j in job_ids if j in self._runners]
        for runner in runners:
            log.info("stopping %s at the scheduler's request", runner.job_id)
            runner.stop(
                self.config.kill_grace_secs,
                note="\n[tiny-scheduler agent: stopped at the scheduler's request]\n",
            )

    def _output_loop(self) -> None:
        while not self._done.wait(OUTPUT_SECS):
            for runner in self._live():
                if runner.live_output:
                    self._send_output(runner)

    def _send_output(self, runner: Runner) -> None:
        out, err = runner.stdout.take_unsent(), runner.stderr.take_unsent()
        if not out and not err:
            return
        body = {"stdout": out.decode("utf-8", "replace"), "stderr": err.decode("utf-8", "replace")}
        try:
            reply = self.wire.call("POST", f"/jobs/{quote(runner.job_id)}/output", json=body)
        except Unreachable:
            reply = None
        if reply is not None and reply.status_code in (404, 405, 409):
            # No such endpoint on this scheduler, or the job is no longer running there: the
            # final report carries the output all the same.
            runner.live_output = False
            return
        if reply is None or not reply.ok:
            runner.stdout.give_back(out)
            runner.stderr.give_back(err)

    def _registry_loop(self) -> None:
        assert self.registry is not None
        while not self._done.is_set():
            self.registry.heartbeat()
            self._done.wait(self.config.registry_heartbeat_secs)
