"""A stand-in for the tiny-aws registry, speaking its protocol as `peers.md` describes.

Used by the local dev cluster, by the tests and by the benchmark. Nodes register and
heartbeat; a node whose last heartbeat is older than `unhealthy_after` seconds is listed as
unhealthy, and one older than `forget_after` disappears. Instances and services are kept as
posted. A key, when given, is required as a bearer token on everything but /health and the
node register / heartbeat calls.

For fault tests it can be told to misbehave (`fault`): answer slowly, with a 500, with
garbage, or hang; and nodes can be forced unhealthy or removed directly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

HEALTHY = "healthy"
UNHEALTHY = "unhealthy"


@dataclasses.dataclass
class _Node:
    id: str
    hostname: str
    addr: str = ""
    cpu_count: int = 1
    role: str = "compute"
    last_seen: float = dataclasses.field(default_factory=time.time)
    forced_status: str | None = None  # set by tests: overrides the heartbeat rule


class FakeRegistry:
    """The registry's state and HTTP server; `start()` serves it on a loopback port."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        key: str | None = None,
        unhealthy_after: float = 30.0,
        forget_after: float = 300.0,
    ) -> None:
        self.key = key
        self.unhealthy_after = unhealthy_after
        self.forget_after = forget_after
        self.fault: str | None = None  # None, "slow", "error", "garbage", "hang"
        self.slow_secs = 0.5
        self.requests = 0
        self._lock = threading.Lock()
        self._nodes: dict[str, _Node] = {}
        self.instances: dict[str, dict[str, Any]] = {}
        self.services: list[dict[str, Any]] = []
        self._release_hang = threading.Event()
        self._server = ThreadingHTTPServer((host, port), _handler_for(self))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeRegistry:
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._release_hang.set()
        self._server.shutdown()
        self._server.server_close()

    # --- state, for the dev cluster and tests ---------------------------------------------------

    def set_node(self, node_id: str, status: str | None = HEALTHY, **fields: Any) -> None:
        """Add or update a node; `status` forces its health (None: follow heartbeats)."""
        with self._lock:
            node = self._nodes.get(node_id) or _Node(id=node_id, hostname=node_id)
            for name, value in fields.items():
                setattr(node, name, value)
            node.forced_status = status
            self._nodes[node_id] = node

    def heartbeat(self, node_id: str, **fields: Any) -> None:
        with self._lock:
            node = self._nodes.get(node_id) or _Node(id=node_id, hostname=node_id)
            for name, value in fields.items():
                if name in ("hostname", "addr", "cpu_count", "role"):
                    setattr(node, name, value)
            node.last_seen = time.time()
            self._nodes[node_id] = node

    def remove_node(self, node_id: str) -> None:
        with self._lock:
            self._nodes.pop(node_id, None)

    def set_instance(self, instance_id: str, node_id: str, status: str = "running") -> None:
        with self._lock:
            self.instances[instance_id] = {
                "id": instance_id,
                "node_id": node_id,
                "status": status,
                "instance_type": "small",
                "cpu_limit": "100%",
                "mem_limit_mb": 512,
                "created_at": _stamp(time.time()),
            }

    def release(self) -> None:
        """Let requests stuck in the `hang` fault finish."""
        self._release_hang.set()

    def nodes_listing(self) -> dict[str, dict[str, Any]]:
        now = time.time()
        with self._lock:
            listing = {}
            for node in self._nodes.values():
                age = now - node.last_seen
                if node.forced_status is None and age > self.forget_after:
                    continue
                fresh = age <= self.unhealthy_after
                status = node.forced_status or (HEALTHY if fresh else UNHEALTHY)
                listing[node.id] = {
                    "id": node.id,
                    "hostname": node.hostname,
                    "addr": node.addr,
                    "cpu_count": node.cpu_count,
                    "role": node.role,
                    "status": status,
                    "last_seen": _stamp(node.last_seen),
                }
            return listing


def _stamp(moment: float) -> str:
    return datetime.datetime.fromtimestamp(moment, datetime.timezone.utc).isoformat()


def _handler_for(registry: FakeRegistry) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Without this every keep-alive answer waits 40 ms for a delayed ACK.
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self._route("GET")

        def do_POST(self) -> None:
            self._route("POST")

        def _route(self, method: str) -> None:
            registry.requests += 1
            parts = urlsplit(self.path)
            path = parts.path.rstrip("/")
            body = self._body()
            open_paths = path == "/health" or (path.startswith("/nodes/") and method == "POST")
            if path == "/health":
                return self._json(200, {"service": "registry", "status": "healthy"})
            authorized = self.headers.get("Authorization") == f"Bearer {registry.key}"
            if registry.key and not open_paths and not authorized:
                return self._text(401, "unauthorized")
            if self._misbehave():
                return None
            if method == "GET" and path == "/nodes":
                role = parse_qs(parts.query).get("role", [None])[0]
                listing = registry.nodes_listing()
                if role:
                    listing = {k: v for k, v in listing.items() if v["role"] == role}
                return self._json(200, listing)
            if method == "GET" and path.startswith("/instances/"):
                instance = registry.instances.get(unquote(path[len("/instances/") :]))
                if instance is None:
                    return self._text(404, "instance not found")
                return self._json(200, instance)
            if method == "POST" and path in ("/nodes/register", "/nodes/heartbeat"):
                node_id = body.get("id") or body.get("hostname")
                if not isinstance(node_id, str) or not node_id:
                    return self._text(400, "id is required")
                registry.heartbeat(node_id, **body)
                return self._json(200, registry.nodes_listing().get(node_id, {}))
            if method == "POST" and path == "/services":
                registry.services.append(body)
                return self._json(201, body)
            return self._text(404, "not found")

        def _misbehave(self) -> bool:
            fault = registry.fault
            if fault == "slow":
                time.sleep(registry.slow_secs)
            elif fault == "hang":
                registry._release_hang.wait(60)
                return True
            elif fault == "error":
                self._text(500, "internal error")
                return True
            elif fault == "garbage":
                self._raw(200, b"<html>definitely not json", "text/html")
                return True
            return False

        def _body(self) -> dict[str, Any]:
            length = int(self.headers.get("Content-Length") or 0)
            if not length:
                return {}
            try:
                data = json.loads(self.rfile.read(length))
            except ValueError:
                return {}
            return data if isinstance(data, dict) else {}

        def _json(self, status: int, body: Any) -> None:
            self._raw(status, json.dumps(body).encode(), "application/json")

        def _text(self, status: int, message: str) -> None:
            self._raw(status, (message + "\n").encode(), "text/plain; charset=utf-8")

        def _raw(self, status: int, data: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(data)

    return Handler
