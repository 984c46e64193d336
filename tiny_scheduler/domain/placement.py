"""Node choice: which healthy compute node gets a job, how many slots a node has, and which
waiting jobs an idle node may take over from others.

- **Least-loaded** (`PLACEMENT=least-loaded`, the default): the healthy node with the lowest
  load, (its due pending `run` jobs + its slots in use) / its slots; among equally loaded
  nodes, the first after the previously chosen one in id order, wrapping around. On an idle
  cluster that is the plain round robin a, b, c, a, b, c; on a busy one work goes where it can
  start soonest. **Round-robin** (`PLACEMENT=round-robin`): the first healthy node after the
  previously chosen one, whatever the loads. (The original iterated a Go map, so its round
  robin was random.) "Previously chosen" moves only when this rule picks a node, for any job
  it places; pinned jobs and jobs moved by an idle node's poll leave it where it is, and a
  look (`peek`, GET /schedule) never moves it.
- A retried job prefers a node other than the one it failed on; an instance-pinned job goes to
  its instance's node or nowhere.
- **Slots**: `MAX_JOBS_PER_NODE`, or with `auto` the node's registry `cpu_count` (at least 1).
- **Moving waiting work** (`JOB_STEALING=1`): a healthy node that polls with a free slot its own
  queue cannot fill may take waiting jobs from nodes that have no free slot, are unhealthy or
  are gone from the registry (`may_take`, `gives_work`). Which jobs may move is the job
  model's rule (`jobs.can_move`); the service does the moving.

A `NodeSource` (the registry client, or any other) supplies the nodes, the job table (through
the `Loads` interface) the load counts, and a `Clock` the time at which a delayed job counts as
due; this module owns the rules and touches neither the store nor the network itself.

Tests: `tests/test_placement.py`.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from fractions import Fraction
from typing import Protocol

from ..clock import SYSTEM, Clock
from ..config import AUTO_SLOTS, ROUND_ROBIN, Settings
from ..errors import PlacementError
from .nodes import Nodes, NodeSource

NO_HEALTHY_NODES = "no healthy compute nodes"
ALL_DRAINED = "no healthy compute nodes (every healthy node is draining)"


class Loads(Protocol):
    """Where the load counts come from (the job table), read for a few nodes at a time."""

    def node_loads(self, node_ids: Sequence[str], now: int) -> dict[str, tuple[int, int]]:
        """For each node: (its pending `run` jobs due at `now`, its slots in use)."""
        ...


@dataclasses.dataclass(frozen=True, slots=True)
class NodeLoad:
    """One node's load as placement sees it."""

    node_id: str
    slots: int
    queued: int  # due pending `run` jobs, pinned ones included
    used: int  # slots in use: running `run` jobs and timed-out ones still running

    @property
    def load(self) -> Fraction:
        return _load(self.queued, self.used, self.slots)

    @property
    def free(self) -> int:
        return max(0, self.slots - self.used)


class Placement:
    """Chooses nodes for jobs; safe to call from any thread."""

    def __init__(
        self, source: NodeSource, settings: Settings, loads: Loads, clock: Clock = SYSTEM
    ) -> None:
        self.source = source
        self._loads = loads
        self._clock = clock
        self._max_jobs = settings.max_jobs_per_node
        self._round_robin = settings.placement == ROUND_ROBIN
        self._turn_lock = threading.Lock()
        self._previous: str | None = None  # the node this rule chose last

    def count_loads_in(self, loads: Loads) -> None:
        """Read the load counts from `loads` from now on (a new leader's term builds a new job
        table); the rotation starts afresh, as after a restart."""
        with self._turn_lock:
            self._loads = loads
            self._previous = None

    # --- choosing a node ---------------------------------------------------------------------

    def place(self, instance_id: str = "", avoid: str | None = None) -> str:
        """The node for a new (or retried, or re-placed) job; raises PlacementError with the
        spec's text.

        `avoid` is the node a retried job failed on (or a re-placed job's lost node): another
        healthy node is preferred, but when it is the only one the job goes back to it.
        """
        if instance_id:
            return self.source.instance_node(instance_id)
        nodes = self.source.nodes()
        with self._turn_lock:
            # Read the loads and move the rotation together: two submissions at once must
            # see each other's turn, or both would take the same "next" node.
            chosen = self._choose(_candidates(nodes.accepting, avoid), nodes)
            self._previous = chosen
        return chosen

    def peek(self) -> str:
        """The node `place()` would choose now for a job without instance or retry, without
        choosing it: a look changes nothing (GET /schedule)."""
        nodes = self.source.nodes()
        with self._turn_lock:
            return self._choose(nodes.accepting, nodes)

    def _choose(self, healthy: Sequence[str], nodes: Nodes) -> str:
        if not healthy:
            if nodes.healthy:
                raise PlacementError(ALL_DRAINED)
            raise PlacementError(NO_HEALTHY_NODES)
        candidates = healthy if self._round_robin else self._least_loaded(healthy, nodes)
        # `healthy` is sorted by id: the first candidate after the previous choice, wrapping.
        previous = self._previous
        if previous is not None:
            for node_id in candidates:
                if node_id > previous:
                    return node_id
        return candidates[0]

    def _least_loaded(self, healthy: Sequence[str], nodes: Nodes) -> list[str]:
        """The nodes of `healthy` with the lowest load, in the order given. Every submission
        comes through here, so it compares plain integers when it can: with a fixed number
        of slots, comparing (queued + used) compares the loads."""
        counts = self._loads.node_loads(healthy, self._clock.now_us())
        loads: dict[str, int] | dict[str, Fraction]
        if self._max_jobs != AUTO_SLOTS:
            loads = {node: queued + used for node, (queued, used) in counts.items()}
        else:
            loads = {
                node: _load(queued, used, self.slots(node, nodes))
                for node, (queued, used) in counts.items()
            }
        lowest = min(loads.values())
        return [node for node in healthy if loads[node] == lowest]

    # --- slots and loads ---------------------------------------------------------------------

    def slots(self, node_id: str, nodes: Nodes | None) -> int:
        """How many `run` jobs the node may run at once. With `auto`, its `cpu_count` from the
        node list given (the cached one on the poll path: never a registry call there); a node
        the list does not know gets 1."""
        if self._max_jobs != AUTO_SLOTS:
            return self._max_jobs
        return nodes.cpu_count(node_id) if nodes is not None else 1

    def loads(
        self, node_ids: Sequence[str], nodes: Nodes | None, now: int | None = None
    ) -> list[NodeLoad]:
        """The load of each node at `now` (default: the clock), in the order given (O(nodes),
        from the table's counters)."""
        counts = self._loads.node_loads(node_ids, self._clock.now_us() if now is None else now)
        return [
            NodeLoad(node_id, self.slots(node_id, nodes), *counts[node_id]) for node_id in node_ids
        ]

    # --- moving waiting work -----------------------------------------------------------------

    @staticmethod
    def may_take(node_id: str, nodes: Nodes | None) -> bool:
        """Whether a polling node may take jobs from others: only one the registry (as last
        fetched) lists as healthy. An agent that polls but whose node the registry thinks
        dead, or that it has never listed, gets only its own jobs."""
        return nodes is not None and nodes.accepts(node_id)

    @staticmethod
    def gives_work(load: NodeLoad, nodes: Nodes) -> bool:
        """Whether a node's waiting jobs may go to an idle node: it has no free slot to start
        them, or it is unhealthy or gone from the registry, so they would wait."""
        return load.free == 0 or not nodes.accepts(load.node_id)


def _candidates(healthy: tuple[str, ...], avoid: str | None) -> tuple[str, ...]:
    if avoid is not None and len(healthy) > 1 and avoid in healthy:
        return tuple(node for node in healthy if node != avoid)
    return healthy


def _load(queued: int, used: int, slots: int) -> Fraction:
    """A node's load, (queued + used) / slots, exact: equal loads must compare equal for the
    tie rule."""
    return Fraction(queued + used, slots)
