"""A stand-in for the tiny-aws SNS service: `POST /topics/{topic}/publish` with
`{"message": "<string>"}` answers `{"delivered": N}` and keeps the messages for inspection."""

from __future__ import annotations

import threading

from .http import PeerServer, Reply, Request


class FakeSns(PeerServer):
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(host, port)
        self._lock = threading.Lock()
        self._published: dict[str, list[str]] = {}

    def published(self, topic: str) -> list[str]:
        with self._lock:
            return list(self._published.get(topic, []))

    def handle(self, request: Request) -> Reply:
        parts = request.path.strip("/").split("/")
        if request.method != "POST" or len(parts) != 3 or parts[0] != "topics":
            return Reply.text(404, "not found")
        if parts[2] != "publish":
            return Reply.text(404, "not found")
        data = request.json()
        if not isinstance(data, dict) or not isinstance(data.get("message"), str):
            return Reply.text(400, "message is required")
        with self._lock:
            self._published.setdefault(parts[1], []).append(data["message"])
        return Reply.json(200, {"delivered": 1})
