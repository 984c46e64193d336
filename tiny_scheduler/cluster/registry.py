"""The registry client: the `NodeSource` of a daemon in the tiny-aws cloud (`REGISTRY_URL`).

Every call has a total deadline (`peers.Peer`), so a hung or trickling registry costs a call a
few seconds and a clear 503, never a hung thread. A deadline per call is not isolation on its
own, though: forty submissions waiting on one trickling fetch would hold forty request threads,
and `/health` and the agents' polls would queue behind them. So the node list is fetched by one
caller at a time, and:

- a list younger than `REGISTRY_CACHE_SECS` is reused as it is;
- while one caller refreshes an older list, the others go on with it (for at most the fetch's
  own deadline past its freshness): a slow registry then holds one thread, not all of them;
- with no usable list, at most `MAX_WAITERS` callers wait for the fetch under way; the rest
  are told at once that the registry cannot be reached;
- a fetch's failure is every waiter's answer; the next caller asks again, so a registry that
  is back is used at once. At most one fetch and `MAX_WAITERS` callers are ever held by a
  registry that hangs or trickles: the other request threads stay free.

Every failure is a `PlacementError` carrying one of the spec's texts. A node with an empty id
is ignored: no agent could ever poll for its jobs.
"""

from __future__ import annotations

import logging
import threading
from typing import Any
from urllib.parse import quote

from ..clock import SYSTEM, Clock
from ..config import REGISTRY_DEADLINE_SECS, Settings
from ..domain.nodes import Nodes
from ..errors import PlacementError
from .peers import CallFailed, CallObserver, Outcome, Peer

__all__ = ["Nodes", "Registry"]

log = logging.getLogger(__name__)

REACH_FAILED = "failed to reach registry"
DECODE_FAILED = "failed to decode registry response"
INSTANCE_NOT_FOUND = "instance not found"

MAX_WAITERS = 8
"""Callers that may wait at once for a node-list fetch when no usable list is cached: the
other request threads stay free for the polls, reports and health checks."""


class Registry:
    """Client of the registry's `/nodes` and `/instances/{id}`; a `NodeSource`."""

    def __init__(
        self,
        settings: Settings,
        observers: list[CallObserver] | None = None,
        clock: Clock = SYSTEM,
    ) -> None:
        headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else None
        self._peer = Peer(
            "registry", settings.registry_url, REGISTRY_DEADLINE_SECS, observers, headers
        )
        self._clock = clock
        self._cache_secs = settings.registry_cache_secs
        self._lock = threading.Lock()
        self._fetched = threading.Condition(self._lock)
        self._cached: Nodes | None = None
        self._in_flight = False
        self._waiters = 0
        self._flight_result: Nodes | PlacementError | None = None
        self._flight_number = 0

    @property
    def url(self) -> str:
        return self._peer.base_url

    def nodes(self) -> Nodes:
        """The compute nodes: from the cache when it is fresh enough, else fetched (see the
        module's notes on who waits for a fetch and who does not)."""
        with self._lock:
            now = self._clock.monotonic()
            cached = self._cached
            age = None if cached is None else now - cached.fetched_at
            if age is not None and age < self._cache_secs:
                return cached  # type: ignore[return-value]
            if self._in_flight:
                if age is not None and age < self._cache_secs + REGISTRY_DEADLINE_SECS:
                    return cached  # type: ignore[return-value]
                return self._wait_for_flight()
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

    def _wait_for_flight(self) -> Nodes:
        """(Lock held.) Wait for the fetch under way, unless enough callers wait already."""
        if self._waiters >= MAX_WAITERS:
            raise PlacementError(REACH_FAILED)
        flight = self._flight_number
        self._waiters += 1
        try:
            # The fetch is bounded by its deadline; the wait is too, whatever happens.
            until = self._clock.monotonic() + REGISTRY_DEADLINE_SECS + 0.5
            while self._flight_number == flight:
                left = until - self._clock.monotonic()
                if left <= 0:
                    raise PlacementError(REACH_FAILED)
                self._fetched.wait(left)
        finally:
            self._waiters -= 1
        return _unwrap(self._flight_result)

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

    def instance_node(self, instance_id: str) -> str:
        """The node of a running instance whose node is healthy."""
        instance = self.instance(instance_id)
        status = instance.get("status")
        if status != "running":
            raise PlacementError(f"instance {instance_id} not running (status={status})")
        node_id = instance.get("node_id")
        if not isinstance(node_id, str) or not self.nodes().is_healthy(node_id):
            raise PlacementError(f"node {node_id} for instance {instance_id} is not healthy")
        return node_id

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
        return Nodes.of(status, cpus, self._clock.monotonic())

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
