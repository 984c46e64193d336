"""SNS events: every final job state is published to SNS_TOPIC, without ever slowing a request.

The service's `finished` event puts a message on a bounded queue and returns at once; one
sender thread publishes it, retrying a few times with backoff, then logs and drops it. A slow
or dead SNS therefore costs no request any time, and at most `QUEUE_SIZE` messages of memory:
when the queue is full the newest event is dropped and logged rather than the scheduler
growing without bound.

The message is double-encoded, as the original's consumers expect:
`{"message":"{\"job_id\":\"job-7\",\"status\":\"done\",\"node_id\":\"node-a\",\"exit_code\":0}"}`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from urllib.parse import quote

import orjson

from ..config import SNS_DEADLINE_SECS, Settings
from ..jobs import Job
from ..peers import CallFailed, CallObserver, Peer
from ..service import Event

log = logging.getLogger(__name__)

QUEUE_SIZE = 10000
"""Events waiting to be published, at most; beyond that new events are dropped (and logged)."""

ATTEMPTS = 4
"""Tries per event before it is given up."""

BACKOFF_SECS = 0.5
"""Wait after the first failed try; doubles after each further one."""

DRAIN_SECS = 3.0
"""On shutdown, how long queued events may still be sent."""


def event_message(job: Job) -> str:
    """The inner JSON of an event (the outer body carries it as a string)."""
    event: dict[str, object] = {"job_id": job.job_id, "status": job.status, "node_id": job.node_id}
    if job.exit_code is not None:
        event["exit_code"] = job.exit_code
    return orjson.dumps(event).decode()


class SnsPublisher:
    """A bounded queue of final-state events and the one thread that publishes them."""

    def __init__(self, settings: Settings, observers: list[CallObserver] | None = None) -> None:
        assert settings.sns_url is not None
        self.path = f"/topics/{quote(settings.sns_topic, safe='')}/publish"
        self.dropped = 0
        self._peer = Peer("sns", settings.sns_url, SNS_DEADLINE_SECS, observers)
        self._queue: queue.Queue[str] = queue.Queue(QUEUE_SIZE)
        self._stop = threading.Event()
        self._drain_until = float("inf")
        self._thread: threading.Thread | None = None

    def depth(self) -> int:
        """Events waiting to be published."""
        return self._queue.qsize()

    def listener(self, event: Event, job: Job | None, detail: str) -> None:
        """A service listener: queue the final states."""
        if event != Event.FINISHED or job is None:
            return
        try:
            self._queue.put_nowait(event_message(job))
        except queue.Full:
            self.dropped += 1
            log.error("SNS queue full: event for job %s (%s) dropped", job.job_id, job.status)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="sns-publisher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._drain_until = time.monotonic() + DRAIN_SECS
        self._stop.set()
        if self._thread is not None:
            self._thread.join(DRAIN_SECS + SNS_DEADLINE_SECS + 1)
        if self.depth():
            log.warning("SNS: %d events not published at shutdown", self.depth())

    def _run(self) -> None:
        while True:
            try:
                message = self._queue.get(timeout=0.2)
            except queue.Empty:
                if self._stop.is_set():
                    return
                continue
            if time.monotonic() > self._drain_until:
                return
            try:
                self._deliver(message)
            except Exception:  # the one sender must outlive any one event
                self.dropped += 1
                log.exception("SNS: event dropped after an unexpected error: %s", message)

    def _deliver(self, message: str) -> None:
        """Try a few times; a stop request turns the remaining waits into one last try."""
        backoff = BACKOFF_SECS
        for attempt in range(1, ATTEMPTS + 1):
            if self.publish(message):
                return
            if attempt == ATTEMPTS or self._stop.wait(backoff):
                break
            backoff *= 2
        self.dropped += 1
        log.error("SNS publish failed %d times, event dropped: %s", attempt, message)

    def publish(self, message: str) -> bool:
        """One try; True when SNS took the message."""
        body = orjson.dumps({"message": message})
        try:
            self._peer.call("POST", self.path, "publish", body, accept=range(200, 300))
        except CallFailed:
            return False  # logged and counted by the peer call
        return True
