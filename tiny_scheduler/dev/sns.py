"""A stand-in for the tiny-aws SNS service: `POST /topics/{topic}/publish` with
`{"message": "<string>"}` answers `{"delivered": N}` and keeps the messages for inspection."""

from __future__ import annotations

import threading

from werkzeug.routing import Rule

from .http import PeerServer, Reply, Request, peer_routes


class FakeSns(PeerServer):
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(host, port)
        self._lock = threading.Lock()
        self._published: dict[str, list[str]] = {}

    def published(self, topic: str) -> list[str]:
        with self._lock:
            return list(self._published.get(topic, []))

    routes = peer_routes(
        # Any topic name, even an empty one: topics need not be created first.
        Rule(
            "/topics/<string(minlength=0):topic>/publish", methods=["POST"], endpoint="on_publish"
        ),
    )

    def on_publish(self, request: Request, topic: str) -> Reply:
        data = request.json()
        if not isinstance(data, dict) or not isinstance(data.get("message"), str):
            return Reply.text(400, "message is required")
        with self._lock:
            self._published.setdefault(topic, []).append(data["message"])
        return Reply.json(200, {"delivered": 1})
