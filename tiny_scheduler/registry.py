"""The registry client: which compute nodes exist, which are healthy, where an instance lives.

Every call has a total deadline (`peers.Peer`), so a hung or trickling registry costs a
request a few seconds and a clear 503, never a hung thread. The node list is cached for
`REGISTRY_CACHE_SECS`, and concurrent callers share one fetch rather than each sending their
own (a slow registry is not then hit by every waiting request); they wait for it no longer
than the fetch's own deadline. Every failure is a `PlacementError` carrying one of the spec's
texts. A node with an empty id is ignored: no agent could ever poll for its jobs.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any
from urllib.parse import quote

from .config import REGISTRY_DEADLINE_SECS, Settings
from .errors import PlacementError
from .peers import CallFailed, CallObserver, Outcome, Peer

log = logging.getLogger(__name__)

REACH_FAILED = "failed to reach registry"
DECODE_FAILED = "failed to decode registry response"
INSTANCE_NOT_FOUND = "instance not found"


@dataclasses.dataclass(frozen=True, slots=True)
class Nodes:
    """One answer of the registry: every compute node it listed, and their health."""

    status: dict[str, str]  # node id -> "healthy", "unhealthy", ...
    fetched_at: float
    healthy: tuple[str, ...] = ()  # healthy node ids, sorted: the round-robin order
    cpus: dict[str, int] = dataclasses.field(default_factory=dict)  # node id -> cpu_count

    @classmethod
    def of(cls, status: dict[str, str], cpus: dict[str, int] | None = None) -> Nodes:
        healthy = tuple(sorted(node for node, state in status.items() if state == "healthy"))
        return cls(status=status, fetched_at=time.monotonic(), healthy=healthy, cpus=cpus or {})

    def is_healthy(self, node_id: str) -> bool:
        return self.status.get(node_id) == "healthy"

    def cpu_count(self, node_id: str) -> int:
        """The node's `cpu_count` as the registry gave it; 1 when it gave none usable."""
        return self.cpus.get(node_id, 1)


class Registry:
    """Client of the registry's `/nodes` and `/instances/{id}`."""

    def __init__(self, settings: Settings, observers: list[CallObserver] | None = None) -> None:
        headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else None
        self._peer = Peer(
            "registry", settings.registry_url, REGISTRY_DEADLINE_SECS, observers, headers
        )
        self._cache_secs = settings.registry_cache_secs
        self._lock = threading.Lock()
        self._fetched = threading.Condition(self._lock)
        self._cached: Nodes | None = None
        self._in_flight = False
        self._flight_result: Nodes | PlacementError | None = None
        self._flight_number = 0

    @property
    def url(self) -> str:
        return self._peer.base_url

    def nodes(self) -> Nodes:
        """The compute nodes, from the cache when it is fresh enough."""
        with self._lock:
            cached = self._cached
            if cached is not None and time.monotonic() - cached.fetched_at < self._cache_secs:
                return cached
            if self._in_flight:
                flight = self._flight_number
                # The fetch is bounded by its deadline; the wait is too, whatever happens.
                until = time.monotonic() + REGISTRY_DEADLINE_SECS + 0.5
                while self._flight_number == flight:
                    left = until - time.monotonic()
                    if left <= 0:
                        raise PlacementError(REACH_FAILED)
                    self._fetched.wait(left)
                return _unwrap(self._flight_result)
            self._in_flight = True
        result: Nodes | PlacementError
        try:
            result = self._fetch_nodes()
        except PlacementError as exc:
            result = exc
        except Exception:
            # Whatever went wrong, the flight must land: every later caller waits on it.
            log.exception("registry: unexpected error reading the node list")
            result = PlacementError(DECODE_FAILED)
        with self._lock:
            if isinstance(result, Nodes):
                self._cached = result
            self._in_flight = False
            self._flight_result = result
            self._flight_number += 1
            self._fetched.notify_all()
        return _unwrap(result)

    def last_outcome(self) -> str | None:
        """The last node-list fetch's failure text, "" when it succeeded, None before any."""
        with self._lock:
            result = self._flight_result
        if result is None:
            return None
        return result.message if isinstance(result, PlacementError) else ""

    def cached_nodes(self) -> Nodes | None:
        """The last node list fetched, however old; never calls the registry."""
        with self._lock:
            return self._cached

    def instance(self, instance_id: str) -> dict[str, Any]:
        """The registry's record of an instance; PlacementError when it has none."""
        path = f"/instances/{quote(instance_id, safe='')}"
        status, data = self._get(path, "instances", accept=(200, 404))
        if status == 404:
            raise PlacementError(INSTANCE_NOT_FOUND)
        if not isinstance(data, dict):
            raise PlacementError(DECODE_FAILED)
        return data

    def _fetch_nodes(self) -> Nodes:
        _, data = self._get("/nodes?role=compute", "nodes")
        if not isinstance(data, dict):
            raise PlacementError(DECODE_FAILED)
        status = {}
        cpus = {}
        for node_id, node in data.items():
            if node_id and isinstance(node, dict):
                status[node_id] = str(node.get("status", ""))
                count = node.get("cpu_count")
                # Anything but a positive integer (absent, 0, a string, a bool) counts as one
                # CPU: a node the registry lists can always run one job.
                if isinstance(count, int) and not isinstance(count, bool) and count >= 1:
                    cpus[node_id] = count
        return Nodes.of(status, cpus)

    def _get(self, path: str, endpoint: str, accept: tuple[int, ...] = (200,)) -> tuple[int, Any]:
        try:
            return self._peer.call_json("GET", path, endpoint, accept=accept)
        except CallFailed as exc:
            text = DECODE_FAILED if exc.outcome == Outcome.GARBAGE else REACH_FAILED
            raise PlacementError(text) from None


def _unwrap(result: Nodes | PlacementError | None) -> Nodes:
    if isinstance(result, Nodes):
        return result
    raise result if result is not None else PlacementError(REACH_FAILED)
