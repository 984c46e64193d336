"""What the scheduler itself knows of its nodes: the agents' heartbeats and the operators'
drains; and the two node sources built on it.

- `NodeBook` keeps, per node, its last heartbeat (when, `cpu_count`, `labels`, `version`, the
  jobs its agent says it runs) and whether it is drained. It is memory only: the service
  stores what must outlive a restart (drains, the nodes' last facts) and loads it back with
  every heartbeat counted as "seen at start-up", so lost-node clocks start again.
- `BuiltinNodes` (`REGISTRY_URL=builtin`) is the node source made of heartbeats alone: a node
  is healthy while its last heartbeat is at most `HEALTHY_BEATS` periods old, unhealthy after
  that, and gone (not listed) after `NODE_LOST_SECS` without one.
- `Drains` wraps any node source (the registry or the built-in one) and marks the drained
  nodes, and those whose agent refuses work, in the lists it gives: healthy, but taking no
  new work.

Health from heartbeats is read at the instant asked, from the clock handed in; nothing here
calls a peer, so every read is instant.

Tests: `tests/test_node_decisions.py`.
"""

from __future__ import annotations

import dataclasses
import math
import threading

from ..clock import Clock
from ..domain.nodes import HEALTHY, NodeFacts, Nodes, NodeSource
from ..errors import PlacementError

HEALTHY_BEATS = 3
"""A node is healthy while its last heartbeat is at most this many periods old."""

UNHEALTHY = "unhealthy"

INSTANCE_NOT_FOUND = "instance not found"


@dataclasses.dataclass(frozen=True, slots=True)
class Beat:
    """A node's last heartbeat, as the book keeps it."""

    at: float  # monotonic seconds, by the book's clock
    at_us: int  # wall-clock microseconds (shown as last_heartbeat_at)
    cpu_count: int
    running: frozenset[str]  # job ids the agent says it runs
    version: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    fence_secs: float | None = None  # None: the node's agent does not fence
    agent_id: str = ""
    refusing_work: str = ""  # why the agent takes no new work ("": it takes work)
    memory_mb: int | None = None  # None: its agent reported no memory
    gpus: int = 0
    enforcement: str = ""

    @property
    def facts(self) -> NodeFacts:
        return NodeFacts(self.memory_mb, self.gpus, self.labels)


class NodeBook:
    """Heartbeats and drains by node id; safe to use from any thread."""

    def __init__(self, clock: Clock, heartbeat_secs: float, lost_secs: float) -> None:
        self.clock = clock
        self.heartbeat_secs = heartbeat_secs
        self.lost_secs = lost_secs
        self._lock = threading.Lock()
        self._beats: dict[str, Beat] = {}
        self._drained: frozenset[str] = frozenset()
        self._misses: dict[str, int] = {}  # job id -> heartbeats in a row that left it out
        self._facts: dict[str, NodeFacts] | None = None  # made from the beats when asked
        self.version = 0  # counts the changes to the beats: a list made of them is stale after

    # --- changes ---------------------------------------------------------------------------

    def beat(self, node_id: str, beat: Beat) -> None:
        with self._lock:
            old = self._beats.get(node_id)
            self._beats[node_id] = beat
            self.version += 1
            if old is None or old.facts != beat.facts:
                self._facts = None

    def restore(self, node_id: str, beat: Beat, drained: bool) -> None:
        """A node known from the store: counted as seen now (its lost clock starts again)."""
        now = self.clock.monotonic()
        with self._lock:
            self._beats[node_id] = dataclasses.replace(beat, at=now)
            self.version += 1
            self._facts = None
            if drained:
                self._drained = self._drained | {node_id}

    def set_drain(self, node_id: str, drain: bool) -> None:
        with self._lock:
            self._drained = self._drained | {node_id} if drain else self._drained - {node_id}

    def forget_all(self) -> None:
        """A term ended: a standby knows no nodes (the next term loads them)."""
        with self._lock:
            self._beats.clear()
            self.version += 1
            self._drained = frozenset()
            self._misses.clear()
            self._facts = None

    def missing(self, job_ids: list[str], listed: frozenset[str]) -> list[str]:
        """Of the jobs the scheduler has running on a node, those its heartbeats have left
        out twice in a row now (one heartbeat may have been built before the agent started
        a job it had just claimed); the count of the others starts again. Counts: call it
        once per heartbeat (the service answers from memory only heartbeats that miss
        nothing, `NodeOps.heartbeat_in_memory`)."""
        lost = []
        with self._lock:
            for job_id in job_ids:
                if job_id in listed:
                    self._misses.pop(job_id, None)
                    continue
                misses = self._misses.get(job_id, 0) + 1
                if misses >= 2:
                    self._misses.pop(job_id, None)
                    lost.append(job_id)
                else:
                    self._misses[job_id] = misses
        return lost

    # --- reads -----------------------------------------------------------------------------

    def drained(self) -> frozenset[str]:
        return self._drained

    def closed(self) -> frozenset[str]:
        """The nodes that take no new work: drained by an operator, or whose agent says it
        cannot keep its promises (`refusing_work`) as of its last heartbeat."""
        with self._lock:
            refusing = {node for node, beat in self._beats.items() if beat.refusing_work}
        return self._drained | refusing if refusing else self._drained

    def other_agent(self, node_id: str, agent_id: str) -> bool:
        """Whether another agent than `agent_id` served this node within its loss time (two
        agents with one node id would each run its jobs)."""
        if not agent_id:
            return False
        with self._lock:
            last = self._beats.get(node_id)
        if last is None or not last.agent_id or last.agent_id == agent_id:
            return False
        return self.clock.monotonic() - last.at <= self.lost_secs

    def beats(self) -> dict[str, Beat]:
        with self._lock:
            return dict(self._beats)

    def facts(self) -> dict[str, NodeFacts]:
        """What each node's agent last reported of its memory, GPUs and labels: the same
        object until one of them changes (do not change it), so that a reader may keep what
        it made of it."""
        with self._lock:
            if self._facts is None:
                self._facts = {node_id: beat.facts for node_id, beat in self._beats.items()}
            return self._facts

    def last_beat(self, node_id: str) -> Beat | None:
        with self._lock:
            return self._beats.get(node_id)

    def health(self, beat: Beat) -> str:
        """`healthy`, `unhealthy` or `gone`, by the age of the node's last heartbeat."""
        age = self.clock.monotonic() - beat.at
        if age <= HEALTHY_BEATS * self.heartbeat_secs:
            return HEALTHY
        return UNHEALTHY if age <= self.lost_secs else "gone"

    def health_changes(self, beat: Beat) -> float:
        """The monotonic time from which `health(beat)` may answer otherwise than now."""
        healthy_until = beat.at + HEALTHY_BEATS * self.heartbeat_secs
        if self.clock.monotonic() <= healthy_until:
            return healthy_until
        return beat.at + self.lost_secs


class BuiltinNodes:
    """The node source of `REGISTRY_URL=builtin`: the agents that heartbeat."""

    def __init__(self, book: NodeBook) -> None:
        self._book = book
        # The last list, the book's version it was made of, and until when (monotonic) every
        # node's health in it holds: each poll asks, and most ask before anything changed.
        self._last: tuple[Nodes, int, float] | None = None

    def nodes(self) -> Nodes:
        book = self._book
        version, now = book.version, book.clock.monotonic()
        last = self._last
        if last is not None and last[1] == version and now < last[2]:
            return last[0]
        status: dict[str, str] = {}
        cpus: dict[str, int] = {}
        facts: dict[str, NodeFacts] = {}
        holds = math.inf
        for node_id, beat in book.beats().items():
            health = book.health(beat)
            if health != "gone":
                status[node_id] = health
                cpus[node_id] = beat.cpu_count
                facts[node_id] = beat.facts
                holds = min(holds, book.health_changes(beat))
        made = Nodes.of(status, cpus, now, facts=facts)
        self._last = (made, version, holds)
        return made

    def cached_nodes(self) -> Nodes | None:
        return self.nodes()  # made from memory at once: never stale

    def last_outcome(self) -> str | None:
        return ""

    def instance_node(self, instance_id: str) -> str:
        # Instances are the tiny-aws cloud's; a cluster of our own agents has none.
        raise PlacementError(INSTANCE_NOT_FOUND)


class Drains:
    """A node source whose lists mark the book's drained nodes, and carry what the nodes'
    agents reported of their memory, GPUs and labels (a registry lists none of that)."""

    def __init__(self, source: NodeSource, book: NodeBook) -> None:
        self.source = source
        self._book = book
        # The last list marked, and what it was made of: the poll asks on every call.
        self._last: tuple[Nodes, dict[str, NodeFacts], frozenset[str], Nodes] | None = None

    def nodes(self) -> Nodes:
        return self._marked(self.source.nodes())

    def cached_nodes(self) -> Nodes | None:
        nodes = self.source.cached_nodes()
        return None if nodes is None else self._marked(nodes)

    def _marked(self, nodes: Nodes) -> Nodes:
        book = self._book
        facts, closed = book.facts(), book.closed()
        last = self._last
        if last is not None and last[0] is nodes and last[1] is facts and last[2] is closed:
            return last[3]
        marked = nodes
        if not nodes.facts:  # a registry's list: the heartbeats of our agents add facts
            marked = marked.with_facts(facts)
        marked = marked.draining(closed)
        self._last = (nodes, facts, closed, marked)
        return marked

    def last_outcome(self) -> str | None:
        return self.source.last_outcome()

    def instance_node(self, instance_id: str) -> str:
        return self.source.instance_node(instance_id)
