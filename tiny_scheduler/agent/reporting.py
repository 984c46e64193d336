"""The agent's reports: a running job's live output (about once a second, from its first
second on: a shorter job's output goes only with its report; a 404/405/409 ends that for the
job), and its final report, kept by the job's folder (and by the spool, fsynced, when no
folder holds it or no scheduler takes it at once), sent across every URL, retried with
backoff while no scheduler answers, and dropped only once a scheduler took it or refused it
for good (a 4xx such as 409 `stale report`: the job is no longer that attempt's). A part of
`Agent` (main.py), kept apart because it is one concern: the state it shares with the rest is
named below.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import time
from typing import Any
from urllib.parse import quote

from .config import AgentConfig
from .runner import Runner, remove_folder
from .spool import Report, Spool
from .wire import REPORT_TIMEOUT, Unreachable, Wire

log = logging.getLogger("tiny_scheduler.agent")

OUTPUT_SECS = 1.0
"""Seconds between two sends of a running job's new output."""

BACKOFF_FIRST_SECS = 0.5
BACKOFF_MAX_SECS = 30.0
"""A report no scheduler took is tried again after 0.5 s, then twice as long each time, up
to this."""

REFUSED_FOR_GOOD = frozenset({400, 404, 409, 410, 413, 422})
"""Answers to a final report that no retry would change: the report is dropped."""


class Reporting:
    """Delivering final reports (a mixin of `Agent`)."""

    config: AgentConfig
    wire: Wire
    spool: Spool
    _lock: threading.Lock
    _held: dict[str, Report]  # in the spool, not yet acknowledged
    _next_try: dict[str, float]  # monotonic time of the next try; inf: in hand
    _delay: dict[str, float]
    _in_flight: set[str]
    _spool_wake: threading.Event
    _done: threading.Event
    _spool_fault: str
    _scheduler_fences: bool

    def _note_reach(self, reached: bool) -> None:  # Agent's
        raise NotImplementedError

    def _live(self) -> list[Runner]:  # Agent's
        raise NotImplementedError

    def _names(self, attempt: int | None) -> dict[str, Any]:  # Agent's
        raise NotImplementedError

    def _spool(self, report: Report) -> None:
        """Keep the report on disk. When the spool cannot take it, the job's result is still
        in its folder (the next start reports it from there), but the agent takes no new
        work until the spool can be written again, and says why."""
        try:
            self.spool.put(report)
        except OSError as exc:
            fault = exc.strerror or str(exc)
            if not self._spool_fault:
                log.error(
                    "cannot write the spool %s (%s): taking no new work until it can be "
                    "written; the report of %s is kept in its job folder",
                    self.spool.folder,
                    fault,
                    report.job_id,
                )
            self._spool_fault = fault

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
        kwargs: dict[str, Any] = {"timeout": timeout or REPORT_TIMEOUT}
        try:
            # A scheduler that fences tells a stale report from a current one itself (409,
            # keeping its output on its own attempt); an older one is asked first.
            if check and not self._scheduler_fences and not self._still_wanted(report, kwargs):
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
        with contextlib.suppress(OSError):
            self.spool.remove(report.job_id)
        if report.folder:
            remove_folder(report.folder)
        with self._lock:
            if self._held.get(report.job_id) is report:
                del self._held[report.job_id]
                self._next_try.pop(report.job_id, None)
                self._delay.pop(report.job_id, None)

    def _later(self, report: Report) -> None:
        with self._lock:
            if self._held.get(report.job_id) is not report:
                return
        if not self.spool.has(report.job_id):
            # No scheduler took it at once: from now on the spool shows it waiting (and its
            # folder, when it has one, keeps it whatever becomes of the spool).
            self._spool(report)
        with self._lock:
            if self._held.get(report.job_id) is not report:
                return
            delay = self._delay.get(report.job_id, BACKOFF_FIRST_SECS)
            self._next_try[report.job_id] = time.monotonic() + delay
            self._delay[report.job_id] = min(delay * 2, BACKOFF_MAX_SECS)

    def _spool_loop(self) -> None:
        while not self._done.is_set():
            if self._spool_fault and self.spool.writable() is None:
                log.info("the spool can be written again: taking work again")
                self._spool_fault = ""
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

    def _output_loop(self) -> None:
        while not self._done.wait(OUTPUT_SECS):
            # A job younger than OUTPUT_SECS has its first send the next round: one that ends
            # before (most of them) sends its output with its final report, in one request.
            started_by = time.monotonic() - OUTPUT_SECS
            for runner in self._live():
                if runner.live_output and runner.created <= started_by:
                    self._send_output(runner)

    def _send_output(self, runner: Runner) -> None:
        out, err = runner.stdout.unsent(), runner.stderr.unsent()
        if not out and not err:
            return
        body = {
            "stdout": out.decode("utf-8", "replace"),
            "stderr": err.decode("utf-8", "replace"),
            **self._names(runner.attempt),
        }
        try:
            reply = self.wire.call("POST", f"/jobs/{quote(runner.job_id)}/output", json=body)
        except Unreachable:
            reply = None
        if reply is not None and reply.status_code in (404, 405, 409):
            # No such endpoint on this scheduler, or the job is no longer running there: the
            # final report carries the output all the same.
            runner.live_output = False
            return
        if reply is not None and reply.ok:
            runner.stdout.sent += len(out)
            runner.stderr.sent += len(err)
            runner.save_sent()
