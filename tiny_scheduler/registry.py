"""The registry client: which compute nodes exist, which are healthy, where an instance lives.

One `requests.Session` with connect and read timeouts, so a hung registry costs a request a few
seconds and a clear 503, never a hung thread. The node list is cached for
`REGISTRY_CACHE_SECS`, and concurrent callers share one fetch rather than each sending their
own (a slow registry is not then hit by every waiting request). Every failure is a
`PlacementError` carrying one of the spec's texts.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any
from urllib.parse import quote

import requests
from requests.adapters import HTTPAdapter

from .config import REGISTRY_CONNECT_TIMEOUT_SECS, REGISTRY_READ_TIMEOUT_SECS, Settings
from .errors import PlacementError

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

    @classmethod
    def of(cls, status: dict[str, str]) -> Nodes:
        healthy = tuple(sorted(node for node, state in status.items() if state == "healthy"))
        return cls(status=status, fetched_at=time.monotonic(), healthy=healthy)

    def is_healthy(self, node_id: str) -> bool:
        return self.status.get(node_id) == "healthy"


class Registry:
    """Client of the registry's `/nodes` and `/instances/{id}`."""

    def __init__(self, settings: Settings) -> None:
        self._base = settings.registry_url
        self._cache_secs = settings.registry_cache_secs
        self._session = requests.Session()
        self._session.trust_env = False  # no proxy or .netrc lookups on a hot path
        self._session.mount("http://", HTTPAdapter(pool_maxsize=32))
        self._session.mount("https://", HTTPAdapter(pool_maxsize=32))
        if settings.api_key:
            self._session.headers["Authorization"] = f"Bearer {settings.api_key}"
        self._timeout = (REGISTRY_CONNECT_TIMEOUT_SECS, REGISTRY_READ_TIMEOUT_SECS)
        self._lock = threading.Lock()
        self._fetched = threading.Condition(self._lock)
        self._cached: Nodes | None = None
        self._in_flight = False
        self._flight_result: Nodes | PlacementError | None = None
        self._flight_number = 0
        self.call_observers: list[Any] = []  # callables (endpoint, result) for metrics

    def nodes(self) -> Nodes:
        """The compute nodes, from the cache when it is fresh enough."""
        with self._lock:
            cached = self._cached
            if cached is not None and time.monotonic() - cached.fetched_at < self._cache_secs:
                return cached
            if self._in_flight:
                flight = self._flight_number
                while self._flight_number == flight:
                    self._fetched.wait()
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

    def instance(self, instance_id: str) -> dict[str, Any]:
        """The registry's record of an instance; PlacementError when it has none."""
        path = f"/instances/{quote(instance_id, safe='')}"
        data = self._get(path, "instances", missing_ok=True)
        if data is None:
            raise PlacementError(INSTANCE_NOT_FOUND)
        if not isinstance(data, dict):
            raise PlacementError(DECODE_FAILED)
        return data

    def _fetch_nodes(self) -> Nodes:
        data = self._get("/nodes?role=compute", "nodes")
        if not isinstance(data, dict):
            raise PlacementError(DECODE_FAILED)
        status = {}
        for node_id, node in data.items():
            if isinstance(node, dict):
                status[node_id] = str(node.get("status", ""))
        return Nodes.of(status)

    def _get(self, path: str, endpoint: str, missing_ok: bool = False) -> Any:
        url = self._base + path
        try:
            response = self._session.get(url, timeout=self._timeout)
        except requests.RequestException as exc:
            self._observe(endpoint, "unreachable")
            log.warning("registry %s: %s", url, exc)
            raise PlacementError(REACH_FAILED) from None
        if missing_ok and response.status_code == 404:
            self._observe(endpoint, "ok")
            return None
        if response.status_code != 200:
            self._observe(endpoint, "error")
            log.warning("registry %s answered %d: %.200s", url, response.status_code, response.text)
            raise PlacementError(REACH_FAILED)
        try:
            data = response.json()
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
            self._observe(endpoint, "garbage")
            log.warning("registry %s answered non-JSON: %.200r", url, response.content)
            raise PlacementError(DECODE_FAILED) from None
        self._observe(endpoint, "ok")
        return data

    def _observe(self, endpoint: str, result: str) -> None:
        for observe in self.call_observers:
            observe(endpoint, result)


def _unwrap(result: Nodes | PlacementError | None) -> Nodes:
    if isinstance(result, Nodes):
        return result
    raise result if result is not None else PlacementError(REACH_FAILED)
