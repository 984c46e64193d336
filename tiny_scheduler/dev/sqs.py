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

from werkzeug.routing import Rule

from .http import PeerServer, Reply, Request, peer_routes

_MESSAGES = "/queues/<string(minlength=0):queue>/messages"
"""A queue's messages; any name, even an empty one, is a queue, as on the real service."""


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

    routes = peer_routes(
        Rule(_MESSAGES, methods=["POST"], endpoint="on_send"),
        Rule(_MESSAGES, methods=["GET"], endpoint="on_receive"),
        Rule(_MESSAGES + "/<message_id>", methods=["DELETE"], endpoint="on_delete"),
    )

    def on_send(self, request: Request, queue: str) -> Reply:
        data = request.json()
        if not isinstance(data, dict) or "body" not in data:
            return Reply.text(400, "body is required")
        return Reply.json(201, {"id": self.send(queue, data["body"])})

    def on_receive(self, request: Request, queue: str) -> Reply:
        return Reply.json(200, self._receive(queue))

    def on_delete(self, request: Request, queue: str, message_id: str) -> Reply:
        with self._lock:
            if self.fail_deletes > 0:
                self.fail_deletes -= 1
                return Reply.text(500, "internal error")
            messages = self._queues.get(queue, [])
            self._queues[queue] = [m for m in messages if m.id != message_id]
            self.deleted.append(message_id)
        return Reply(204)

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
