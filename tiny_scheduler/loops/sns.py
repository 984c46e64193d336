"""SNS events: every final job state is published to SNS_TOPIC, at least once and in order,
without ever slowing a request.

Events are not kept in memory. The service stores each one in the store's outbox in the same
transaction as the change that made the job final (`Reads.keep_final_events`), so a final
state that was acknowledged has its event on disk, across crashes. One sender thread reads the
outbox oldest first, a page at a time, publishes each event and removes it once SNS took it;
a crash between the publish and the removal publishes it again after the restart
(at-least-once). An event SNS does not take is tried `ATTEMPTS` times with backoff, logged, and
tried again every `RETRY_SECS`, with the events behind it waiting their turn: they go out in
the order of the changes.

So a slow or dead SNS costs a request nothing (the event is one more row in a transaction the
request commits anyway) and the scheduler no memory: the outbox grows on disk, the sender holds
one page. The outbox's size is the `tiny_scheduler_sns_queue_depth` gauge.

The message is double-encoded, as the original's consumers expect:
`{"message":"{\"job_id\":\"job-7\",\"status\":\"done\",\"node_id\":\"node-a\",\"exit_code\":0}"}`;
a failure carries its `reason` too (`exit`, `timeout`, `node_lost`, `cancelled`).
"""

from __future__ import annotations

import logging
import threading
import time
from urllib.parse import quote

import orjson

from ..cluster.peers import CallFailed, CallObserver, Peer
from ..config import SNS_DEADLINE_SECS, Settings
from ..domain.jobs import Job, job_id_of
from ..errors import StoreError
from ..service import Event, OutboxEvent, Scheduler

log = logging.getLogger(__name__)

PAGE_SIZE = 100
"""Events read from the outbox at a time: all the sender holds in memory."""

ATTEMPTS = 4
"""Tries in a row for one event before the sender logs and pauses."""

BACKOFF_SECS = 0.5
"""Wait after the first failed try; doubles after each further one."""

RETRY_SECS = 5.0
"""After `ATTEMPTS` failed tries, how long the sender waits before trying again."""

IDLE_SECS = 1.0
"""With nothing to send, how often the sender looks again without being told of an event."""

DRAIN_SECS = 3.0
"""On shutdown, how long waiting events may still be sent (the rest wait for the next start)."""


def event_message(job: Job) -> str:
    """The inner JSON of an event (the outer body carries it as a string)."""
    event: dict[str, object] = {"job_id": job.job_id, "status": job.status, "node_id": job.node_id}
    if job.exit_code is not None:
        event["exit_code"] = job.exit_code
    if job.reason is not None:
        event["reason"] = job.reason
    return orjson.dumps(event).decode()


class SnsPublisher:
    """The one thread that publishes the outbox's events to SNS."""

    def __init__(
        self, service: Scheduler, settings: Settings, observers: list[CallObserver] | None = None
    ) -> None:
        assert settings.sns_url is not None
        self.path = f"/topics/{quote(settings.sns_topic, safe='')}/publish"
        self._service = service
        self._peer = Peer("sns", settings.sns_url, SNS_DEADLINE_SECS, observers)
        self._delivered: list[int] = []  # published, not yet removed from the outbox
        self._failing = False  # SNS refused the last event: log once per outage
        self._wake = threading.Event()  # an event was stored, or stop
        self._stop = threading.Event()
        self._drain_until = float("inf")
        self._thread: threading.Thread | None = None

    def depth(self) -> int:
        """Events waiting to be published (the outbox's size; no I/O)."""
        return self._service.reads.events_waiting()

    def listener(self, event: Event, job: Job | None, detail: str) -> None:
        """A service listener: a final state's event was just committed; go and send it."""
        if event == Event.FINISHED:
            self._wake.set()

    def start(self) -> None:
        self._stop.clear()  # started again when this daemon leads again (PostgreSQL)
        self._drain_until = float("inf")
        self._thread = threading.Thread(target=self._run, name="sns-publisher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._drain_until = time.monotonic() + DRAIN_SECS
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(DRAIN_SECS + SNS_DEADLINE_SECS + 1)
        if self.depth():
            log.info("SNS: %d events wait in the outbox for the next start", self.depth())

    def _run(self) -> None:
        while True:
            try:
                sent, refused = self._send_page()
            except Exception:  # the one sender must outlive any one event
                log.exception("SNS sender: unexpected error; trying again in %.0fs", RETRY_SECS)
                sent, refused = False, True
            if self._stop.is_set() and (refused or not sent or self._drained()):
                self._remove_delivered()
                return
            if refused:
                # Not woken early by new events: they would only meet the same refusal.
                self._stop.wait(RETRY_SECS)
            elif not sent:
                self._wake.wait(IDLE_SECS)
                self._wake.clear()

    def _drained(self) -> bool:
        return time.monotonic() > self._drain_until

    def _send_page(self) -> tuple[bool, bool]:
        """Publish the oldest waiting events, in order, until one is refused; returns (some
        event was published, an event was refused)."""
        if self._delivered and not self._remove_delivered():
            return False, True  # the store cannot be written: try again later
        if self._service.reads.events_waiting() == 0:
            return False, False
        try:
            page = self._service.reads.waiting_events(PAGE_SIZE)
        except StoreError as exc:
            log.error("SNS: cannot read the outbox (%s); trying again", exc.__cause__)
            return False, True
        sent = False
        for event in page:
            if not self._deliver(event):
                self._remove_delivered()
                return sent, True
            self._delivered.append(event.id)
            sent = True
            if self._stop.is_set() and self._drained():
                break
        self._remove_delivered()
        return sent, False

    def _remove_delivered(self) -> bool:
        """Remove the published events from the outbox; False when the store refused (they
        are kept in memory, at most a page of ids, and removed on the next try)."""
        if not self._delivered:
            return True
        try:
            self._service.reads.events_delivered(self._delivered)
        except StoreError:
            return False
        self._delivered.clear()
        return True

    def _deliver(self, event: OutboxEvent) -> bool:
        """Try a few times; a stop request turns the remaining waits into one last try."""
        backoff = BACKOFF_SECS
        for attempt in range(1, ATTEMPTS + 1):
            if self.publish(event.message):
                if self._failing:
                    self._failing = False
                    log.warning("SNS takes events again; %d waiting", self.depth())
                return True
            if attempt == ATTEMPTS or self._stop.wait(backoff):
                break
            backoff *= 2
        if not self._failing:
            self._failing = True
            log.error(
                "SNS publish failed %d times; the event for %s and %d more wait in the outbox, "
                "tried again every %.0fs: %s",
                attempt,
                job_id_of(event.seq),
                max(self.depth() - 1, 0),
                RETRY_SECS,
                event.message,
            )
        return False

    def publish(self, message: str) -> bool:
        """One try; True when SNS took the message."""
        body = orjson.dumps({"message": message})
        try:
            self._peer.call("POST", self.path, "publish", body, accept=range(200, 300))
        except CallFailed:
            return False  # logged and counted by the peer call
        return True
