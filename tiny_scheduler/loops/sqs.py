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
from collections.abc import Callable
from typing import Any

import requests

from .. import errors, validation
from ..service import Scheduler

log = logging.getLogger(__name__)

BATCH_LIMIT = 500
"""Messages taken in one tick at most, so one tick never runs unbounded."""

TIMEOUT_SECS = (1.0, 5.0)
"""Connect and read timeouts of one SQS call."""


class SqsIngest:
    """The SQS client and what one tick does with the queue's messages."""

    def __init__(self, service: Scheduler) -> None:
        settings = service.settings
        assert settings.sqs_url is not None
        self.service = service
        self.queue_url = f"{settings.sqs_url}/queues/{settings.sqs_queue}/messages"
        self.call_observers: list[Callable[[str, str], None]] = []
        self._session = requests.Session()
        self._session.trust_env = False

    def tick(self) -> int:
        """Ingest what the queue holds; returns how many jobs were created."""
        created = 0
        for _ in range(BATCH_LIMIT):
            message = self.receive()
            if message is None:
                break
            outcome = self.handle(message)
            if outcome == "created":
                created += 1
            elif outcome == "stop":
                break
        return created

    def handle(self, message: dict[str, Any]) -> str:
        """Deal with one message: created, duplicate, invalid, kept or stop."""
        message_id, body = message.get("id"), message.get("body")
        if not isinstance(message_id, str) or not message_id or not _encodable(message_id):
            log.error("SQS message without a usable id ignored: %.500r", message)
            return "invalid"
        try:
            if not isinstance(body, str):
                raise errors.BadRequest(errors.DECODE_JOB)
            # A lone surrogate cannot be UTF-8: keep it in the bytes so that the JSON parser
            # refuses the body, rather than failing here on every redelivery.
            raw = body.encode("utf-8", "surrogatepass")
            request = validation.parse_job_request(raw)
        except errors.BadRequest as exc:
            log.warning("SQS message %s rejected (%s), deleting it: %.2000r", message_id, exc, body)
            self.delete(message_id)
            return "invalid"
        digest = hashlib.sha256(raw).hexdigest()[:16]
        try:
            job, created = self.service.submit(request, f"sqs:{message_id}:{digest}", "sqs")
        except errors.PlacementError as exc:
            log.warning("SQS message %s kept for later: %s", message_id, exc.message)
            return "kept"
        except errors.StoreError as exc:
            log.error("SQS message %s kept, store unavailable: %s", message_id, exc.message)
            return "stop"
        if created:
            log.info("SQS message %s ingested as %s", message_id, job.job_id)
        else:
            log.info("SQS message %s delivered again; %s already exists", message_id, job.job_id)
        self.delete(message_id)
        return "created" if created else "duplicate"

    def receive(self) -> dict[str, Any] | None:
        """One message, or None when the queue is empty or cannot be read."""
        try:
            response = self._session.get(self.queue_url, timeout=TIMEOUT_SECS)
        except requests.RequestException as exc:
            self._observe("receive", "unreachable")
            log.warning("SQS receive from %s failed: %s", self.queue_url, exc)
            return None
        if response.status_code != 200:
            self._observe("receive", "error")
            log.warning("SQS receive answered %d: %.200s", response.status_code, response.text)
            return None
        try:
            data = response.json()
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
            self._observe("receive", "garbage")
            log.warning("SQS receive answered non-JSON: %.200r", response.content)
            return None
        self._observe("receive", "ok")
        if data is not None and not isinstance(data, dict):
            log.warning("SQS receive answered neither a message nor null: %.200r", data)
            return None
        return data

    def delete(self, message_id: str) -> bool:
        """Delete a handled message; a failure only means SQS delivers it again."""
        url = f"{self.queue_url}/{requests.utils.quote(message_id, safe='')}"
        try:
            response = self._session.delete(url, timeout=TIMEOUT_SECS)
        except requests.RequestException as exc:
            self._observe("delete", "unreachable")
            log.warning("SQS delete of %s failed: %s", message_id, exc)
            return False
        if response.status_code // 100 != 2:
            self._observe("delete", "error")
            log.warning("SQS delete of %s answered %d", message_id, response.status_code)
            return False
        self._observe("delete", "ok")
        return True

    def _observe(self, call: str, result: str) -> None:
        for observe in self.call_observers:
            observe(call, result)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
