"""Background work: the daemon threads that keep the cluster honest while nobody calls.

`Background` owns their lifecycle: built by the app factory, started once from the gunicorn
worker hook, stopped on shutdown. The loops (`scan`: timeouts, lost nodes, retention; `sqs`:
ingestion; `schedules`: fires) and the SNS publisher change jobs only through the service.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ..cluster.peers import CallObserver
from ..config import SCHEDULE_TICK_SECS
from ..service import Scheduler

log = logging.getLogger(__name__)


class Loop:
    """Runs `tick` every `interval` seconds on a daemon thread until stopped.

    An exception in one tick is logged with its traceback and the loop goes on: one bad job
    or one unreachable peer must never end the background work for good.
    """

    def __init__(self, name: str, interval: float, tick: Callable[[], object]) -> None:
        self.name = name
        self.interval = interval
        self.tick = tick
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop = threading.Event()  # fresh: a loop stopped at the end of a term may start again
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def run_once(self) -> None:
        """One tick, with the loop's error handling (tests call this directly)."""
        try:
            self.tick()
        except Exception:
            log.exception("%s: tick failed; will try again in %.1fs", self.name, self.interval)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.run_once()


class Background:
    """The scheduler's loops and the SNS publisher, started and stopped together."""

    def __init__(self, service: Scheduler, observers: list[CallObserver] | None = None) -> None:
        from .scan import Scan
        from .schedules import ScheduleFiring
        from .sns import SnsPublisher, event_message
        from .sqs import SqsIngest

        settings = service.settings
        self.service = service
        self.scan = Scan(service)
        self.loops = [Loop("scan", settings.timeout_scan_interval_secs, self.scan.tick)]
        self.schedules = ScheduleFiring(service)
        self.loops.append(Loop("schedules", SCHEDULE_TICK_SECS, self.schedules.tick))
        self.sqs: SqsIngest | None = None
        if settings.sqs_url:
            self.sqs = SqsIngest(service, observers)
            self.loops.append(Loop("sqs", settings.sqs_poll_interval_secs, self.sqs.tick))
        self.sns: SnsPublisher | None = None
        if settings.sns_url:
            # From now on final states store their event, so those of requests served before
            # start() are published too.
            self.sns = SnsPublisher(service, settings, observers)
            service.reads.keep_final_events(event_message)
            service.listeners.append(self.sns.listener)
        self._started = False

    def start(self, schedules_since: int | None = None) -> None:
        """Start the loops; `schedules_since` (microseconds) is when schedules last ran, when
        another scheduler ran them until a moment ago (a new leader's term)."""
        if self._started:
            return
        self._started = True
        # A new leader's term (PostgreSQL) starts the loops again: every node counts as
        # freshly seen, so no job fails for an absence the previous leader was timing.
        self.scan.reset()
        if self.sns is not None:
            self.sns.start()
        self.schedules.start(schedules_since)
        for loop in self.loops:
            loop.start()
            log.info("started the %s loop (every %.2fs)", loop.name, loop.interval)

    def stop(self) -> None:
        for loop in self.loops:
            loop.stop()
        if self.sns is not None:
            self.sns.stop()
        self._started = False
