"""SQS ingestion: jobs submitted through the `SQS_QUEUE` queue, every SQS_POLL_INTERVAL_SECS.

Each tick drains the queue (until it answers `null`, at most `BATCH_LIMIT` messages). A body is
checked by exactly the rules of `POST /jobs`. Then:
- invalid body: logged with the message id and body, and deleted (it will never be valid);
- no node can take it (placement fails): left alone, SQS delivers it again later;
- the store cannot write: left alone, and the tick ends;
- otherwise the job is created and committed, and only then the message deleted.

Delivery is at-least-once (the scheduler may die between saving the job and deleting the
message), so the job records which message created it, and a redelivered message finds its
job instead of creating a second one. The key is the message id together with a digest of
its body: an SQS that restarts and numbers its messages from 1 again must not make a new
message look like an old one.
"""

from __future__ import annotations

import hashlib
import logging
from enum import Enum
from typing import Any
from urllib.parse import quote

from .. import errors
from ..cluster.peers import CallFailed, CallObserver, Peer
from ..config import SQS_DEADLINE_SECS
from ..domain import validation
from ..service import Scheduler

log = logging.getLogger(__name__)

BATCH_LIMIT = 500
"""Messages taken in one tick at most, so one tick never runs unbounded."""


class Handled(str, Enum):
    """What became of one message."""

    __str__ = str.__str__

    CREATED = "created"  # a job was created, the message deleted
    DUPLICATE = "duplicate"  # it had created its job before; deleted
    INVALID = "invalid"  # not a valid job request; logged and deleted
    KEPT = "kept"  # no node could take it: left for redelivery
    STOP = "stop"  # the store cannot write: left, and the tick ends


class SqsIngest:
    """The SQS client and what one tick does with the queue's messages."""

    def __init__(self, service: Scheduler, observers: list[CallObserver] | None = None) -> None:
        settings = service.settings
        assert settings.sqs_url is not None
        self.service = service
        self.queue_path = f"/queues/{quote(settings.sqs_queue, safe='')}/messages"
        self._peer = Peer("sqs", settings.sqs_url, SQS_DEADLINE_SECS, observers)

    def tick(self) -> int:
        """Ingest what the queue holds; returns how many jobs were created."""
        created = 0
        for _ in range(BATCH_LIMIT):
            message = self.receive()
            if message is None:
                break
            outcome = self.handle(message)
            if outcome == Handled.CREATED:
                created += 1
            elif outcome == Handled.STOP:
                break
        return created

    def handle(self, message: dict[str, Any]) -> Handled:
        """Deal with one message."""
        message_id, body = message.get("id"), message.get("body")
        if not isinstance(message_id, str) or not message_id or not _encodable(message_id):
            log.error("SQS message without a usable id ignored: %s", repr(message)[:500])
            return Handled.INVALID
        try:
            if not isinstance(body, str):
                raise errors.BadRequest(errors.DECODE_JOB)
            # A lone surrogate cannot be UTF-8: keep it in the bytes so that the JSON parser
            # refuses the body, rather than failing here on every redelivery.
            raw = body.encode("utf-8", "surrogatepass")
            request = validation.parse_job_request(raw)
        except errors.BadRequest as exc:
            log.warning(
                "SQS message %s rejected (%s), deleting it: %s",
                message_id,
                exc,
                repr(body)[:2000],
            )
            self.delete(message_id)
            return Handled.INVALID
        try:
            job, created = self.service.jobs.submit(request, message_key(message_id, raw), "sqs")
        except errors.BadRequest as exc:
            # Valid on its own, but refused by what the scheduler knows: a dependency that
            # does not exist, or no known node could ever run it. Redelivery changes nothing.
            log.warning("SQS message %s refused (%s), deleting it", message_id, exc.message)
            self.delete(message_id)
            return Handled.INVALID
        except errors.PlacementError as exc:
            log.warning("SQS message %s kept for later: %s", message_id, exc.message)
            return Handled.KEPT
        except errors.StoreError as exc:
            log.error("SQS message %s kept, store unavailable: %s", message_id, exc.message)
            return Handled.STOP
        if created:
            log.info("SQS message %s ingested as %s", message_id, job.job_id)
        else:
            log.info(
                "SQS message %s delivered again; %s already exists",
                message_id,
                job.job_id,
            )
        self.delete(message_id)
        return Handled.CREATED if created else Handled.DUPLICATE

    def receive(self) -> dict[str, Any] | None:
        """One message, or None when the queue is empty or cannot be read."""
        try:
            _, data = self._peer.call_json("GET", self.queue_path, "receive")
        except CallFailed:
            return None  # logged and counted by the peer call
        if data is not None and not isinstance(data, dict):
            log.warning("SQS receive answered neither a message nor null: %s", repr(data)[:200])
            return None
        return data

    def delete(self, message_id: str) -> bool:
        """Delete a handled message; a failure only means SQS delivers it again."""
        path = f"{self.queue_path}/{quote(message_id, safe='')}"
        try:
            self._peer.call("DELETE", path, "delete", accept=range(200, 300))
        except CallFailed:
            return False
        return True


def message_key(message_id: str, raw: bytes) -> str:
    """The dedupe key of a message: its id and a digest of its body. The id alone is not
    enough: an SQS that was reset numbers its messages from msg-1 again, and a new message
    with an old id must make its own job; a redelivery (same id, same body) makes none."""
    return f"sqs:{message_id}:{hashlib.sha256(raw).hexdigest()[:16]}"


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
