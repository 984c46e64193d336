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
        self._refusing: frozenset[str] = frozenset()  # nodes whose agent refuses work
        self.changes = 0
        """Counts the changes a node list made from the book would show (a node new or back
        to health, its CPUs or facts changed): the same count, the same list until a node's
        health ages (`BuiltinNodes`)."""
        self.resets = 0
        """Counts the times the book was loaded or emptied (a term begins or ends)."""

    # --- changes ---------------------------------------------------------------------------

    def beat(self, node_id: str, beat: Beat) -> None:
        with self._lock:
            old = self._beats.get(node_id)
            self._beats[node_id] = beat
            if old is None or old.facts != beat.facts:
                self._facts = None
            if (
                old is None
                or old.facts != beat.facts
                or old.cpu_count != beat.cpu_count
                or self.health(old) != HEALTHY
            ):
                self.changes += 1
            if bool(beat.refusing_work) != (node_id in self._refusing):
                self._refusing = (
                    self._refusing | {node_id} if beat.refusing_work else self._refusing - {node_id}
                )

    def restore(self, node_id: str, beat: Beat, drained: bool) -> None:
        """A node known from the store: counted as seen now (its lost clock starts again)."""
        now = self.clock.monotonic()
        with self._lock:
            self._beats[node_id] = dataclasses.replace(beat, at=now)
            self._facts = None
            self.resets += 1
            if drained:
                self._drained = self._drained | {node_id}

    def set_drain(self, node_id: str, drain: bool) -> None:
        with self._lock:
            self._drained = self._drained | {node_id} if drain else self._drained - {node_id}

    def forget_all(self) -> None:
        """A term ended: a standby knows no nodes (the next term loads them)."""
        with self._lock:
            self._beats.clear()
            self._drained = frozenset()
            self._misses.clear()
            self._refusing = frozenset()
            self.resets += 1
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
        refusing = self._refusing
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


class BuiltinNodes:
    """The node source of `REGISTRY_URL=builtin`: the agents that heartbeat.

    The list is made once and kept while it stays true: until the book counts a change
    (`NodeBook.changes`) or the first moment a node's health ages. Every heartbeat, poll and
    submission asks for it, and thousands of nodes made it a walk over all of them each time.
    Like a registry's cache (`REGISTRY_CACHE_SECS`), the cached list (`cached_nodes`) may lag
    the book's changes by up to CACHED_LAG_SECS (a burst of agents registering at once makes
    it again once, not once each); `nodes` is always as fresh as the book.
    """

    CACHED_LAG_SECS = 0.1

    def __init__(self, book: NodeBook) -> None:
        self._book = book
        self._lock = threading.Lock()
        # (the book's counts of changes and resets, made at, valid until, the list)
        self._made: tuple[int, int, float, float, Nodes] | None = None

    def nodes(self) -> Nodes:
        return self._list(lag_secs=0.0)

    def cached_nodes(self) -> Nodes | None:
        return self._list(lag_secs=self.CACHED_LAG_SECS)  # made from memory at once

    def _list(self, lag_secs: float) -> Nodes:
        """The list, made again when the book changed more than `lag_secs` after it was
        made, or when a node's health in it has aged."""
        book = self._book
        now = book.clock.monotonic()
        made = self._made
        if made is not None and now < made[3] and made[1] == book.resets:
            changes, _, at, _, nodes = made
            if changes == book.changes or now < at + lag_secs:
                return nodes
        with self._lock:
            # Read before the beats: a change meanwhile makes the list again.
            changes, resets = book.changes, book.resets
            nodes, until = self._make(now)
            self._made = (changes, resets, now, until, nodes)
        return nodes

    def _make(self, now: float) -> tuple[Nodes, float]:
        """The list as of `now`, and the first moment one of its nodes' health ages."""
        book = self._book
        healthy_for = HEALTHY_BEATS * book.heartbeat_secs
        status: dict[str, str] = {}
        cpus: dict[str, int] = {}
        facts: dict[str, NodeFacts] = {}
        until = math.inf
        for node_id, beat in book.beats().items():
            health = book.health(beat)
            if health == "gone":
                continue
            status[node_id] = health
            cpus[node_id] = beat.cpu_count
            facts[node_id] = beat.facts
            ages_at = beat.at + (healthy_for if health == HEALTHY else book.lost_secs)
            until = min(until, ages_at)
        return Nodes.of(status, cpus, now, facts=facts), until

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
