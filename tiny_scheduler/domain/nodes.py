"""Where the compute nodes come from: the `NodeSource` interface, and the node list it gives.

Placement, the poll, the lost-node scan, health and the dashboard ask a `NodeSource`, never a
concrete client, so they work the same whichever source a daemon runs with:

- `registry.Registry`: the tiny-aws node registry over HTTP (`REGISTRY_URL=http://…`);
- `StaticNodes`: a list the caller sets, for tests of the decisions (and anything that knows
  its nodes without asking anyone).

A source answers two questions: `nodes()`, a list fresh enough to place work by (it may call
a peer, so only paths that may wait a peer's deadline ask it), and `cached_nodes()`, the last
list it had, however old, which never waits on anything: the agent poll and `/health` read
only that.

Tests: `tests/test_placement.py` (node lists as placement reads them).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Protocol

from ..errors import PlacementError

__all__ = ["NodeFacts", "NodeRecord", "NodeSource", "Nodes", "StaticNodes"]

HEALTHY = "healthy"


@dataclasses.dataclass(frozen=True, slots=True)
class NodeFacts:
    """What this project's agent reported of its node beyond its CPUs: its memory (None: not
    reported, as for a registry node), its GPUs and its labels."""

    memory_mb: int | None = None
    gpus: int = 0
    labels: tuple[tuple[str, str], ...] = ()


NO_FACTS = NodeFacts()


@dataclasses.dataclass(frozen=True, slots=True)
class Nodes:
    """One node list: every compute node the source knows, and their health."""

    status: dict[str, str]  # node id -> "healthy", "unhealthy", ...
    fetched_at: float = 0.0  # monotonic seconds, by the source's clock
    healthy: tuple[str, ...] = ()  # healthy node ids, sorted: the round-robin order
    cpus: dict[str, int] = dataclasses.field(default_factory=dict)  # node id -> cpu_count
    drained: frozenset[str] = frozenset()  # nodes an operator drains: healthy, but no new work
    accepting: tuple[str, ...] = ()  # healthy nodes not drained, sorted: where work may go
    facts: dict[str, NodeFacts] = dataclasses.field(default_factory=dict)  # from heartbeats

    @classmethod
    def of(
        cls,
        status: dict[str, str],
        cpus: dict[str, int] | None = None,
        fetched_at: float = 0.0,
        drained: frozenset[str] = frozenset(),
        facts: dict[str, NodeFacts] | None = None,
    ) -> Nodes:
        healthy = tuple(sorted(node for node, state in status.items() if state == HEALTHY))
        accepting = tuple(node for node in healthy if node not in drained) if drained else healthy
        return cls(status, fetched_at, healthy, cpus or {}, drained, accepting, facts or {})

    def draining(self, drained: frozenset[str]) -> Nodes:
        """The same list with `drained` as the drained nodes."""
        if drained == self.drained:
            return self
        return Nodes.of(self.status, self.cpus, self.fetched_at, drained, self.facts)

    def with_facts(self, facts: dict[str, NodeFacts]) -> Nodes:
        """The same list with what the nodes' agents reported (a registry's list has none)."""
        if facts == self.facts or not facts:
            return self
        return dataclasses.replace(self, facts={**self.facts, **facts})

    def facts_of(self, node_id: str) -> NodeFacts:
        return self.facts.get(node_id, NO_FACTS)

    def is_healthy(self, node_id: str) -> bool:
        return self.status.get(node_id) == HEALTHY

    def accepts(self, node_id: str) -> bool:
        """Whether new work may go to the node: healthy and not drained."""
        return node_id not in self.drained and self.is_healthy(node_id)

    def cpu_count(self, node_id: str) -> int:
        """The node's `cpu_count` as the source gave it; 1 when it gave none usable."""
        return self.cpus.get(node_id, 1)


class NodeSource(Protocol):
    """Which compute nodes exist, which are healthy, and where an instance lives."""

    def nodes(self) -> Nodes:
        """A node list fresh enough to place work by; PlacementError (with the spec's text)
        when there is none. May wait on a peer, within its deadline."""
        ...

    def cached_nodes(self) -> Nodes | None:
        """The last node list, however old; None before the first. Never waits."""
        ...

    def last_outcome(self) -> str | None:
        """The last fetch's failure text, "" when it succeeded, None before any."""
        ...

    def instance_node(self, instance_id: str) -> str:
        """The healthy node a running instance lives on; PlacementError otherwise."""
        ...


class StaticNodes:
    """A node list set by its owner; instances as a dict of instance id -> node id."""

    def __init__(
        self,
        status: dict[str, str] | None = None,
        cpus: dict[str, int] | None = None,
        instances: dict[str, str] | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._nodes: Nodes | None = None
        self._failure: str | None = None
        self.instances = dict(instances or {})
        if status is not None:
            self.set(status, cpus)

    def set(
        self,
        status: dict[str, str],
        cpus: dict[str, int] | None = None,
        facts: dict[str, NodeFacts] | None = None,
    ) -> None:
        """From now on the nodes are these (and the source answers again)."""
        with self._lock:
            self._nodes = Nodes.of(dict(status), dict(cpus or {}), facts=dict(facts or {}))
            self._failure = None

    def fail(self, text: str) -> None:
        """From now on `nodes()` raises PlacementError(text), as an unreachable peer would;
        the cached list stays."""
        with self._lock:
            self._failure = text

    def nodes(self) -> Nodes:
        with self._lock:
            if self._failure is not None:
                raise PlacementError(self._failure)
            if self._nodes is None:
                raise PlacementError("no node list yet")
            return self._nodes

    def cached_nodes(self) -> Nodes | None:
        with self._lock:
            return self._nodes

    def last_outcome(self) -> str | None:
        with self._lock:
            if self._failure is not None:
                return self._failure
            return None if self._nodes is None else ""

    def instance_node(self, instance_id: str) -> str:
        node_id = self.instances.get(instance_id)
        if node_id is None:
            raise PlacementError("instance not found")
        if not self.nodes().is_healthy(node_id):
            raise PlacementError(f"node {node_id} for instance {instance_id} is not healthy")
        return node_id


@dataclasses.dataclass(frozen=True, slots=True)
class NodeRecord:
    """What is stored of a node: the facts of its last heartbeat that changed, and its drain.
    Not the heartbeat's time: after a restart every node counts as seen at start-up."""

    node_id: str
    cpu_count: int = 1
    labels: tuple[tuple[str, str], ...] = ()
    version: str = ""
    drain: bool = False
    seen_at: int = 0  # wall-clock microseconds of the heartbeat that changed the facts
    memory_mb: int | None = None  # round four: the node's capacity beyond its CPUs
    gpus: int = 0
    enforcement: str = ""  # how its agent enforces jobs' limits: cgroup-v2, cgroup-v1, none
