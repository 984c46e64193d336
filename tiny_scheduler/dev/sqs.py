"""A stand-in for the tiny-aws SQS service, as `peers.md` describes it.

Producers `POST /queues/{name}/messages` with `{"body": "<string>"}` and get `{"id":"msg-N"}`.
`GET /queues/{name}/messages` hands out one visible message (`id`, `body`, `receive_count`) and
hides it for `visibility_secs`, or answers `null`; a message not deleted in time is delivered
again (at-least-once). `DELETE /queues/{name}/messages/{id}` always answers 204.

For fault tests: `fail_deletes` makes the next N deletes answer 500 without deleting, and the
base server's `fault` modes apply to every call.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from typing import Any

from .http import PeerServer, Reply, Request


@dataclasses.dataclass
class Message:
    id: str
    body: Any
    receive_count: int = 0
    visible_at: float = 0.0


class FakeSqs(PeerServer):
    def __init__(self, host: str = "127.0.0.1", port: int = 0, visibility_secs: float = 30.0):
        super().__init__(host, port)
        self.visibility_secs = visibility_secs
        self.fail_deletes = 0
        self.deleted: list[str] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._queues: dict[str, list[Message]] = {}

    def send(self, queue: str, body: Any) -> str:
        """Enqueue a message directly (what a producer's POST does)."""
        with self._lock:
            message = Message(id=f"msg-{next(self._ids)}", body=body)
            self._queues.setdefault(queue, []).append(message)
            return message.id

    def messages(self, queue: str) -> list[Message]:
        with self._lock:
            return list(self._queues.get(queue, []))

    def handle(self, request: Request) -> Reply:
        parts = request.path.strip("/").split("/")
        if len(parts) < 3 or parts[0] != "queues" or parts[2] != "messages":
            return Reply.text(404, "not found")
        queue = parts[1]
        if request.method == "POST" and len(parts) == 3:
            data = request.json()
            if not isinstance(data, dict) or "body" not in data:
                return Reply.text(400, "body is required")
            return Reply.json(201, {"id": self.send(queue, data["body"])})
        if request.method == "GET" and len(parts) == 3:
            return Reply.json(200, self._receive(queue))
        if request.method == "DELETE" and len(parts) == 4:
            with self._lock:
                if self.fail_deletes > 0:
                    self.fail_deletes -= 1
                    return Reply.text(500, "internal error")
                messages = self._queues.get(queue, [])
                self._queues[queue] = [m for m in messages if m.id != parts[3]]
                self.deleted.append(parts[3])
            return Reply(204)
        return Reply.text(404, "not found")

    def _receive(self, queue: str) -> dict[str, Any] | None:
        now = time.monotonic()
        with self._lock:
            for message in self._queues.get(queue, []):
                if message.visible_at <= now:
                    message.receive_count += 1
                    message.visible_at = now + self.visibility_secs
                    return {
                        "id": message.id,
                        "body": message.body,
                        "receive_count": message.receive_count,
                    }
        return None
