"""The agent's heartbeats: what it tells the scheduler about its node each period, and what it
does with the answer — the period, drain, stop orders, the jobs handed out, and the fence it
moves on after every answered heartbeat (when no answer comes for `fence_secs`, the jobs'
owners stop them). A part of `Agent` (main.py), kept apart because it is one concern: the
state it shares with the rest is named below.

By default the heartbeat waits for work (`wait_for_work`): it says how many slots are free
(`want`) and may wait up to a heartbeat period (`wait_secs`) for its answer, which comes at
once when the scheduler places work on the node, and hands that work out; the agent starts
it and renews the wait at once. So a job starts within a round trip of its submission, and
the period stays what it was: at most `heartbeat_secs` between two heartbeats sent. A
scheduler that does not wait (its answer has no `jobs`) is polled instead, every `poll_secs`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time

from ..domain import fencing
from . import owner
from .config import AgentConfig
from .heartbeat import Beat, Facts, beat
from .protocol import PolledJob
from .resources import Capacity
from .runner import Runner
from .wire import Wire

log = logging.getLogger("tiny_scheduler.agent")

UNTAKEN_PAUSE_SECS = 1.0
"""Seconds before the next wait when the last answer handed out jobs and none of them could
be taken (they do not fit here now): the scheduler would hand them out again at once."""


class Heartbeating:
    """Heartbeats and their answers (a mixin of `Agent`)."""

    config: AgentConfig
    wire: Wire
    version: str
    agent_id: str
    fatal: str
    capacity: Capacity
    enforcement: str
    _lock: threading.Lock
    _runners: dict[str, Runner]
    _done: threading.Event
    _draining: threading.Event
    _beaten: threading.Event  # a heartbeat was answered since start or outage
    _beat_lock: threading.Lock
    _heartbeat_secs: float
    _heartbeats_unsupported: bool
    _drain_flag: bool  # the last heartbeat reply's `drain`
    _fence_secs: float | None  # known once a heartbeat answer says enough
    _fence_deadline: float | None  # monotonic; None: no fence (yet)
    fence_file: str  # the node's fence, which every job's owner reads
    _job_timeout_secs: float
    _other_agent: str  # the scheduler's 409: another agent serves this node
    _beat_status: int  # the heartbeat's last answer, to log changes only
    _scheduler_fences: bool
    _period_known: bool  # the scheduler's answer gave its heartbeat period

    def _note_reach(self, reached: bool) -> None:  # Agent's
        raise NotImplementedError

    def running_attempts(self) -> dict[str, int | None]:  # Agent's
        raise NotImplementedError

    def refusing_work(self) -> str:  # Agent's
        raise NotImplementedError

    def _live(self) -> list[Runner]:  # Agent's
        raise NotImplementedError

    def free_slots(self) -> int:  # Agent's
        raise NotImplementedError

    def _take(self, polled: list[PolledJob]) -> int:  # Agent's
        raise NotImplementedError

    def _fall_back_to_polling(self) -> None:  # Agent's
        raise NotImplementedError

    def _heartbeat_loop(self) -> None:
        waits = self.config.wait_for_work
        while not self._done.is_set():
            # A wait no longer than the scheduler's period (it refuses a longer one): the
            # first heartbeat, or the first after a refusal, waits for nothing and learns it.
            # A stopping agent takes nothing: its heartbeats go on (its jobs' fences need
            # them) without waiting, so that it never waits a whole period to exit.
            asked = waits and self._period_known and not self._draining.is_set()
            result, taken = self._beat(wait=asked)
            if waits and result.answered and not result.supported:
                # No heartbeat endpoint at all (a scheduler from before round three).
                waits = False
                self._fall_back_to_polling()
                self._done.wait(self._heartbeat_secs)
            elif result.status // 100 != 2:
                self._done.wait(self._heartbeat_secs)  # unanswered or refused: no hurry
            elif not waits or self._draining.is_set():
                self._done.wait(self._heartbeat_secs)
            elif not result.waited and (asked or not self._period_known):
                log.info(
                    "the scheduler does not wait for work: polling every %gs instead",
                    self.config.poll_secs,
                )
                waits = False
                self._fall_back_to_polling()
                self._done.wait(self._heartbeat_secs)
            elif result.jobs and not taken:
                self._done.wait(UNTAKEN_PAUSE_SECS)
            # else: wait again at once

    def heartbeat_once(self) -> bool:
        """Send one heartbeat (that does not wait) and act on its reply; whether a scheduler
        answered it."""
        result, _ = self._beat(wait=False)
        return result.answered

    def _beat(self, wait: bool) -> tuple[Beat, int]:
        """One heartbeat, waiting for work or not, and what was done with its answer: the
        answer, and how many of the jobs it handed out were started."""
        with self._beat_lock:
            want = self.free_slots() if wait else 0
            facts = Facts(
                cpu_count=self.config.slots,
                attempts=self.running_attempts(),
                version=self.version,
                agent_id=self.agent_id,
                fence_secs=self._fence_secs,
                refusing_work=self.refusing_work(),
                memory_mb=self.capacity.memory_mb,
                gpus=self.capacity.gpus,
                labels=self.capacity.labels,
                enforcement=self.enforcement,
                wait_secs=self._heartbeat_secs if wait else None,
                want=want,
            )
            sent_at = time.monotonic()
            result = beat(self.wire, self.config.node_id, facts)
            self._on_beat(result, sent_at)
            if result.answered:
                self._beaten.set()
            taken = 0
            if result.jobs and result.status // 100 == 2 and not self._other_agent:
                taken = self._take(list(result.jobs))
            return result, taken

    def _on_beat(self, result: Beat, sent_at: float) -> None:
        if result.status != self._beat_status and result.answered:
            if result.status // 100 != 2 and result.supported:
                log.warning("heartbeat answered %d: %s", result.status, result.text)
            self._beat_status = result.status
        if result.status == 400 and result.text.startswith("wait_secs"):
            self._period_known = False  # its period is shorter now: ask it again
        if result.status == 409:
            if not self._other_agent:
                log.error(
                    "the scheduler says another agent serves node %s (%s): taking no work",
                    self.config.node_id,
                    result.text,
                )
            self._other_agent = result.text or "another agent serves this node"
            return
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
            if self._other_agent:
                log.info("the scheduler takes this agent's heartbeats again: taking work")
                self._other_agent = ""
            if result.heartbeat_secs:
                self._heartbeat_secs = result.heartbeat_secs
            self._period_known = bool(result.heartbeat_secs)
            if result.job_timeout_secs is not None:
                self._job_timeout_secs = result.job_timeout_secs
            self._renew_fence(result, sent_at)
            if result.drain != self._drain_flag:
                # The scheduler gives a draining node no new work; nothing to do here
                # but say so.
                self._drain_flag = result.drain
                log.info("the scheduler %s this node", "drains" if result.drain else "undrains")
            self._obey_stops(result.stop)

    def _renew_fence(self, result: Beat, sent_at: float) -> None:
        """After a heartbeat the leader answered: the fence moves on, counted from when the
        heartbeat was sent (the answer is no older than that)."""
        if result.node_lost_secs is None:
            # A scheduler from before fencing: it waits NODE_LOST_SECS alone. No fence, then:
            # not even one an earlier run of the agent left.
            if self._fence_deadline is not None or os.path.exists(self.fence_file):
                self._fence_deadline = None
                with contextlib.suppress(OSError):
                    owner.write_node_fence(self.fence_file, None)
            return
        self._scheduler_fences = True
        period = result.heartbeat_secs or self._heartbeat_secs
        asked = self.config.fence_secs
        if asked is not None:
            refusal = fencing.fence_refusal(asked, result.node_lost_secs, period)
            if refusal is not None:
                self.fatal = refusal
                log.error("%s: exiting", refusal)
                self._draining.set()
                return
        fence = (
            asked if asked is not None else fencing.fence_secs_auto(result.node_lost_secs, period)
        )
        if fence != self._fence_secs:
            log.info("fence: the jobs stop when no heartbeat is answered for %gs", fence)
        self._fence_secs = fence
        self._fence_deadline = sent_at + fence
        try:
            owner.write_node_fence(self.fence_file, self._fence_deadline)
        except OSError as exc:
            log.warning("cannot move the node's fence on (%s)", exc)
        for runner in self._live():
            runner.renew_fence(self._fence_deadline)  # a job whose owner has a fence of its own

    def _obey_stops(self, job_ids: tuple[str, ...]) -> None:
        with self._lock:
            runners = [self._runners[j] for j in job_ids if j in self._runners]
        for runner in runners:
            log.info("stopping %s at the scheduler's request", runner.job_id)
            runner.stop(note="\n[tiny-scheduler agent: stopped at the scheduler's request]\n")
