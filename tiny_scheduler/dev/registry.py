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

import dataclasses
import datetime
import threading
import time
from typing import Any

from werkzeug.routing import Rule

from .http import PeerServer, Reply, Request, peer_routes

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


class FakeRegistry(PeerServer):
    """The registry's state and HTTP server; `start()` serves it on a loopback port."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        key: str | None = None,
        unhealthy_after: float = 30.0,
        forget_after: float = 300.0,
    ) -> None:
        super().__init__(host, port)
        self.key = key
        self.unhealthy_after = unhealthy_after
        self.forget_after = forget_after
        self._lock = threading.Lock()
        self._nodes: dict[str, _Node] = {}
        self.instances: dict[str, dict[str, Any]] = {}
        self.services: list[dict[str, Any]] = []

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

    # --- the protocol ------------------------------------------------------------------------

    routes = peer_routes(
        Rule("/health", endpoint="on_health"),
        Rule("/nodes", methods=["GET"], endpoint="on_nodes"),
        Rule("/nodes/register", methods=["POST"], endpoint="on_node_call"),
        Rule("/nodes/heartbeat", methods=["POST"], endpoint="on_node_call"),
        Rule("/instances/<rest:instance_id>", methods=["GET"], endpoint="on_instance"),
        Rule("/services", methods=["POST"], endpoint="on_service"),
    )

    def exempt_from_faults(self, request: Request) -> bool:
        return request.endpoint in _OPEN_ENDPOINTS

    def handle(self, request: Request) -> Reply:
        authorized = request.headers.get("Authorization") == f"Bearer {self.key}"
        # The key is checked before the route, as the real registry does: without the key,
        # an unknown path is a 401 too.
        if self.key and request.endpoint not in _OPEN_ENDPOINTS and not authorized:
            return Reply.text(401, "unauthorized")
        return super().handle(request)

    def on_health(self, request: Request) -> Reply:
        return Reply.json(200, {"service": "registry", "status": "healthy"})

    def on_nodes(self, request: Request) -> Reply:
        listing = self.nodes_listing()
        role = request.query.get("role")
        if role:
            listing = {k: v for k, v in listing.items() if v["role"] == role}
        return Reply.json(200, listing)

    def on_instance(self, request: Request, instance_id: str) -> Reply:
        instance = self.instances.get(instance_id)
        if instance is None:
            return Reply.text(404, "instance not found")
        return Reply.json(200, instance)

    def on_node_call(self, request: Request) -> Reply:
        """A node's register or heartbeat (both open: nodes carry no key)."""
        body = _object(request)
        node_id = body.get("id") or body.get("hostname")
        if not isinstance(node_id, str) or not node_id:
            return Reply.text(400, "id is required")
        self.heartbeat(node_id, **body)
        return Reply.json(200, self.nodes_listing().get(node_id, {}))

    def on_service(self, request: Request) -> Reply:
        body = _object(request)
        self.services.append(body)
        return Reply.json(201, body)


_OPEN_ENDPOINTS = ("on_health", "on_node_call")
"""What answers without the key and whatever the fault: the health check, and the node calls
(a node that cannot heartbeat would turn unhealthy, which is not the fault being tested)."""


def _object(request: Request) -> dict[str, Any]:
    body = request.json()
    return body if isinstance(body, dict) else {}


def _stamp(moment: float) -> str:
    return datetime.datetime.fromtimestamp(moment, datetime.timezone.utc).isoformat()
