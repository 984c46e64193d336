"""The agent's heartbeats: what it tells the scheduler about its node each period, and what it
does with the answer — the period, drain, stop orders, and the fence it moves on after every
answered heartbeat (when no answer comes for `fence_secs`, the jobs' owners stop them). A part
of `Agent` (main.py), kept apart because it is one concern: the state it shares with the rest
is named below.
"""

from __future__ import annotations

import logging
import threading
import time

from ..domain import fencing
from .config import AgentConfig
from .heartbeat import Beat, Facts, beat
from .resources import Capacity
from .runner import Runner
from .wire import Wire

log = logging.getLogger("tiny_scheduler.agent")


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
    _job_timeout_secs: float
    _other_agent: str  # the scheduler's 409: another agent serves this node
    _beat_status: int  # the heartbeat's last answer, to log changes only
    _scheduler_fences: bool

    def _note_reach(self, reached: bool) -> None:  # Agent's
        raise NotImplementedError

    def running_attempts(self) -> dict[str, int | None]:  # Agent's
        raise NotImplementedError

    def refusing_work(self) -> str:  # Agent's
        raise NotImplementedError

    def _live(self) -> list[Runner]:  # Agent's
        raise NotImplementedError

    def _heartbeat_loop(self) -> None:
        while not self._done.is_set():
            self.heartbeat_once()
            self._done.wait(self._heartbeat_secs)

    def heartbeat_once(self) -> bool:
        """Send one heartbeat and act on its reply; whether a scheduler answered it."""
        with self._beat_lock:
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
            )
            sent_at = time.monotonic()
            result = beat(self.wire, self.config.node_id, facts)
            self._on_beat(result, sent_at)
            if result.answered:
                self._beaten.set()
            return result.answered

    def _on_beat(self, result: Beat, sent_at: float) -> None:
        if result.status != self._beat_status and result.answered:
            if result.status // 100 != 2 and result.supported:
                log.warning("heartbeat answered %d: %s", result.status, result.text)
            self._beat_status = result.status
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
            return  # a scheduler from before fencing: it waits NODE_LOST_SECS alone
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
        for runner in self._live():
            runner.renew_fence(self._fence_deadline)

    def _obey_stops(self, job_ids: tuple[str, ...]) -> None:
        with self._lock:
            runners = [self._runners[j] for j in job_ids if j in self._runners]
        for runner in runners:
            log.info("stopping %s at the scheduler's request", runner.job_id)
            runner.stop(note="\n[tiny-scheduler agent: stopped at the scheduler's request]\n")
