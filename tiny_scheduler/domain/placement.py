"""Node choice: which healthy compute node gets a job, what a node has, and which waiting
jobs an idle node may take over from others.

Placement is a pipeline of small rules (the Kubernetes scheduler framework's shape): filters
decide where a job may go, one scorer picks among the survivors.

- **Filters**: healthy and not drained (`Nodes.accepting`); the job's `node_selector`,
  `node_ids` and needs against each node's capacity (`fit.could_run`); a retried job's
  failed node left out while another one can run it (`avoid`).
- **Scorers** (`PLACEMENT`): `least-loaded` (the default): the lowest load, (what its due
  waiting `run` jobs need + its CPUs in use) / its CPUs; among equally loaded nodes, the first
  after the previously chosen one in id order, wrapping around. On an idle cluster that is
  the plain round robin a, b, c, a, b, c; on a busy one work goes where it can start soonest.
  `round-robin`: the first node after the previously chosen one, whatever the loads. (The
  original iterated a Go map, so its round robin was random.) `binpack`: the node where the
  job fits now with the fewest CPUs left over (ties: memory, then node id), counting the work
  already waiting there, so whole nodes stay free for big jobs; where it fits nowhere now,
  as `least-loaded`. "Previously chosen" moves only when a rule picks a node, for any job it
  places; pinned jobs and jobs moved by an idle node's poll leave it where it is, and a look
  (`peek`, GET /schedule) never moves it.
- An instance-pinned job goes to its instance's node or nowhere.
- **A node's capacity** (`capacity`): its CPUs are its slots, `MAX_JOBS_PER_NODE` or with
  `auto` its `cpu_count` (at least 1); memory, GPUs and labels as its agent reported them.
- **Moving waiting work** (`JOB_STEALING=1`): a healthy node that polls with room its own
  queue cannot fill may take waiting jobs from nodes that cannot start them (`may_take`,
  `gives_work`). Which jobs may move is the job model's rule (`jobs.can_move`), whether one
  fits the taker is `fit`'s; the service does the moving.

A `NodeSource` (the registry client, or any other) supplies the nodes, the job table (through
the `Loads` interface) what each node's jobs need and use, and a `Clock` the time at which a
delayed job counts as due; this module owns the rules and touches neither the store nor the
network itself.

Tests: `tests/test_placement.py`, `tests/test_fit.py`.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import NamedTuple, Protocol

from ..clock import SYSTEM, Clock
from ..config import AUTO_SLOTS, BINPACK, ROUND_ROBIN, Settings
from ..errors import PlacementError
from . import fit
from .fit import NOTHING, UNREPORTED_MEMORY, Capacity, Resources, Wants
from .nodes import Nodes, NodeSource

NO_HEALTHY_NODES = "no healthy compute nodes"
ALL_DRAINED = "no healthy compute nodes (every healthy node is draining)"
NONE_THAT_FITS = "no healthy compute nodes that can run this job"
NEVER_FITS = "no node can run this job: "
"""The start of the 400 a job gets when no known node could ever run it (`never_fits`)."""


class Loads(Protocol):
    """Where the load counts come from (the job table), read for a few nodes at a time."""

    def node_resources(
        self, node_ids: Sequence[str], now: int
    ) -> dict[str, tuple[Resources, Resources]]:
        """For each node: (what its pending jobs due at `now` need, what it has allocated)."""
        ...


class NodeLoad(NamedTuple):
    """One node's load as placement sees it (a named tuple: every poll that may move work
    makes one per node)."""

    node_id: str
    slots: int  # its CPUs
    queued: int  # CPUs its due pending `run` jobs need, pinned ones included
    used: int  # CPUs in use: running `run` jobs and timed-out ones still running
    total: Resources = NOTHING  # what it has (its capacity)
    allocated: Resources = NOTHING  # what its running jobs take
    waiting: Resources = NOTHING  # what its due pending jobs need

    @property
    def load(self) -> Fraction:
        return _load(self.queued, self.used, self.slots)

    @property
    def free(self) -> int:
        """Free CPUs."""
        return max(0, self.slots - self.used)

    @property
    def available(self) -> Resources:
        """What it has free now."""
        return self.total - self.allocated


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
        self._binpack = settings.placement == BINPACK
        self._turn_lock = threading.Lock()
        self._previous: str | None = None  # the node this rule chose last
        self._known = _PerList(None)

    def count_loads_in(self, loads: Loads) -> None:
        """Read the load counts from `loads` from now on (a new leader's term builds a new job
        table); the rotation starts afresh, as after a restart."""
        with self._turn_lock:
            self._loads = loads
            self._previous = None

    # --- choosing a node ---------------------------------------------------------------------

    def place(
        self,
        instance_id: str = "",
        avoid: str | None = None,
        wants: Wants | None = None,
        rather_not: str | None = None,
    ) -> str:
        """The node for a new (or retried, or re-placed) job that `wants` what it says (a
        job or a request: its needs, `node_selector` and `node_ids`; None: one plain CPU);
        raises PlacementError with the spec's text.

        `avoid` is the node a retried job failed on (or a re-placed job's lost node): another
        node that can run it is preferred, but when it is the only one the job goes back to
        it. `rather_not` is a second node left out only while a third one remains: the node a
        re-placed retry failed on, which its first placement already left out on purpose.
        """
        if instance_id:
            return self.source.instance_node(instance_id)
        nodes = self.source.nodes()
        with self._turn_lock:
            # Read the loads and move the rotation together: two submissions at once must
            # see each other's turn, or both would take the same "next" node.
            chosen = self._choose(nodes, wants, avoid, rather_not=rather_not)
            self._previous = chosen
        return chosen

    def place_many(
        self, count: int, instance_id: str = "", wants: Wants | None = None
    ) -> list[str]:
        """The nodes for `count` copies of one job (an array), as `count` submissions one
        after another would be placed, except that each sees the copies placed before it in
        the loads (they are not in the table yet) and the node list is fetched once."""
        return self._place_each([(count, instance_id, wants)], in_batch=False)[0]

    def place_each(self, asked: Sequence[tuple[int, str, Wants | None]]) -> list[list[str]]:
        """The nodes of several submissions made together (a batch), each `(count,
        instance_id, wants)` as `place_many` takes it: each copy sees every copy placed
        before it, of its own submission or an earlier one. An instance nobody knows is
        the error of its item (`job 3: instance not found`)."""
        return self._place_each(asked, in_batch=True)

    def _place_each(
        self, asked: Sequence[tuple[int, str, Wants | None]], in_batch: bool
    ) -> list[list[str]]:
        nodes: Nodes | None = None
        placed: dict[str, Resources] = {}
        answer: list[list[str]] = []
        for index, (count, instance_id, wants) in enumerate(asked):
            if instance_id:
                try:
                    answer.append([self.source.instance_node(instance_id)] * count)
                except PlacementError as exc:
                    raise exc.of_item(index) if in_batch else exc from None
                continue
            if nodes is None:
                nodes = self.source.nodes()
            need = fit.need_of(wants) if wants is not None else Resources(1)
            chosen: list[str] = []
            with self._turn_lock:
                for _ in range(count):
                    node = self._choose(nodes, wants, None, placed)
                    self._previous = node
                    placed[node] = placed.get(node, NOTHING) + need
                    chosen.append(node)
            answer.append(chosen)
        return answer

    def peek(self, wants: Wants | None = None) -> str:
        """The node `place()` would choose now for a job without instance or retry, without
        choosing it: a look changes nothing (GET /schedule)."""
        nodes = self.source.nodes()
        with self._turn_lock:
            return self._choose(nodes, wants, None)

    def never_fits(self, wants: Wants) -> str | None:
        """Why no known node (healthy, unhealthy or draining: every node not gone) could run
        the job even when empty, or None when one could; None too when the node list cannot
        be had now (placement then says why)."""
        if not fit.is_particular(wants):
            return None  # a plain job fits every node
        try:
            nodes = self.source.nodes()
        except PlacementError:
            return None
        answers = self._per_list(nodes).never_fits
        shape = fit.shape_of(wants)  # jobs ask for a few shapes
        if shape not in answers:
            capacities = [self.capacity(node, nodes) for node in sorted(nodes.status)]
            answers[shape] = fit.never_fits(wants, capacities)
        return answers[shape]

    def _choose(
        self,
        nodes: Nodes,
        wants: Wants | None,
        avoid: str | None,
        placed: Mapping[str, Resources] | None = None,
        rather_not: str | None = None,
    ) -> str:
        """The node for one job (`placed`: what copies of it placed just now need, by node:
        not in the table's counts yet)."""
        accepting = nodes.accepting
        if not accepting:
            if nodes.healthy:
                raise PlacementError(ALL_DRAINED)
            raise PlacementError(NO_HEALTHY_NODES)
        eligible = accepting
        if wants is not None and fit.is_particular(wants):
            eligible = tuple(
                node for node in accepting if fit.could_run(wants, self.capacity(node, nodes))
            )
            if not eligible:
                raise PlacementError(NONE_THAT_FITS)
        eligible = _candidates(_candidates(eligible, avoid), rather_not)
        if self._round_robin:
            return self._next_after(eligible)
        counts = self._loads.node_resources(eligible, self._clock.now_us())
        if placed:
            counts = {
                node: (waiting + placed.get(node, NOTHING), used)
                for node, (waiting, used) in counts.items()
            }
        if self._binpack:
            packed = self._tightest(eligible, nodes, wants, counts)
            if packed is not None:
                return packed
        return self._next_after(self._least_loaded(eligible, nodes, counts))

    def _next_after(self, candidates: Sequence[str]) -> str:
        """The first candidate (sorted by id) after the previous choice, wrapping around."""
        previous = self._previous
        if previous is not None:
            for node_id in candidates:
                if node_id > previous:
                    return node_id
        return candidates[0]

    def _least_loaded(
        self,
        healthy: Sequence[str],
        nodes: Nodes,
        counts: Mapping[str, tuple[Resources, Resources]],
    ) -> list[str]:
        """The nodes of `healthy` with the lowest load, in the order given. Every submission
        comes through here, so it compares plain integers when it can: with a fixed number
        of slots, comparing (queued + used) compares the loads; and with any node idle, the
        lowest load is 0, which exactly the idle nodes have (thousands of nodes made a
        Fraction each the larger part of a submission)."""
        loads = {node: queued.cpus + used.cpus for node, (queued, used) in counts.items()}
        if self._max_jobs != AUTO_SLOTS or 0 in loads.values():
            lowest = min(loads.values())
            return [node for node in healthy if loads[node] == lowest]
        # Loads of nodes of different sizes, (queued + used) / slots, compared exactly (equal
        # loads must tie) by cross-multiplying: a Fraction a node was most of a busy
        # cluster's submission.
        slots = {node: self.slots(node, nodes) for node in loads}
        top, bottom = 1, 0  # the lowest load so far, as a fraction: none yet (infinite)
        for node, load in loads.items():
            if load * bottom < top * slots[node]:
                top, bottom = load, slots[node]
        return [node for node in healthy if loads[node] * bottom == top * slots[node]]

    def _tightest(
        self,
        eligible: Sequence[str],
        nodes: Nodes,
        wants: Wants | None,
        counts: Mapping[str, tuple[Resources, Resources]],
    ) -> str | None:
        """Binpack's choice: of the nodes where the job fits now, counting what already waits
        there, the one with the fewest CPUs left over (ties: memory, then node id)."""
        need = fit.need_of(wants) if wants is not None else Resources(1)
        best: tuple[int, int, str] | None = None
        for node in eligible:
            waiting, allocated = counts[node]
            spare = self.capacity(node, nodes).total - allocated - waiting
            if spare.covers(need):
                left = spare - need
                score = (left.cpus, left.memory_mb, node)
                if best is None or score < best:
                    best = score
        return None if best is None else best[2]

    # --- slots and loads ---------------------------------------------------------------------

    def slots(self, node_id: str, nodes: Nodes | None) -> int:
        """How many CPUs of `run` jobs the node may run at once (a plain job takes one). With
        `auto`, its `cpu_count` from the node list given (the cached one on the poll path:
        never a registry call there); a node the list does not know gets 1."""
        if self._max_jobs != AUTO_SLOTS:
            return self._max_jobs
        return nodes.cpu_count(node_id) if nodes is not None else 1

    def capacity(self, node_id: str, nodes: Nodes | None) -> Capacity:
        """What the node has: its CPUs (its slots), and the memory, GPUs and labels its agent
        reported (a node nobody reported memory for fits any `memory_mb`)."""
        if nodes is None:
            return self._capacity(node_id, None)
        capacities = self._per_list(nodes).capacities
        found = capacities.get(node_id)
        if found is None:
            found = capacities[node_id] = self._capacity(node_id, nodes)
        return found

    def _per_list(self, nodes: Nodes) -> _PerList:
        """What is worked out once per node list (see `_PerList`)."""
        known = self._known
        if known.nodes is not nodes:
            # Swapped whole, so a thread that read the old one keeps a consistent one.
            known = self._known = _PerList(nodes)
        return known

    def _capacity(self, node_id: str, nodes: Nodes | None) -> Capacity:
        facts = nodes.facts_of(node_id) if nodes is not None else None
        if facts is None:
            return Capacity(node_id, Resources(self.slots(node_id, nodes), UNREPORTED_MEMORY))
        memory = UNREPORTED_MEMORY if facts.memory_mb is None else facts.memory_mb
        return Capacity(
            node_id,
            Resources(self.slots(node_id, nodes), memory, facts.gpus),
            dict(facts.labels),
        )

    def loads(
        self, node_ids: Sequence[str], nodes: Nodes | None, now: int | None = None
    ) -> list[NodeLoad]:
        """The load of each node at `now` (default: the clock), in the order given (O(nodes),
        from the table's counters)."""
        counts = self._loads.node_resources(node_ids, self._clock.now_us() if now is None else now)
        found = []
        for node_id in node_ids:
            waiting, allocated = counts[node_id]
            total = self.capacity(node_id, nodes).total
            found.append(
                NodeLoad(
                    node_id, total.cpus, waiting.cpus, allocated.cpus, total, allocated, waiting
                )
            )
        return found

    # --- moving waiting work -----------------------------------------------------------------

    @staticmethod
    def may_take(node_id: str, nodes: Nodes | None) -> bool:
        """Whether a polling node may take jobs from others: only one the registry (as last
        fetched) lists as healthy. An agent that polls but whose node the registry thinks
        dead, or that it has never listed, gets only its own jobs."""
        return nodes is not None and nodes.accepts(node_id)

    @staticmethod
    def gives_work(load: NodeLoad, nodes: Nodes) -> bool:
        """Whether some of a node's waiting jobs may go to an idle node: it has not free what
        they need to start (no free CPU at all, or less than they need together), or it is
        unhealthy or gone from the registry, so they would wait."""
        return (
            load.free == 0
            or not load.available.covers(load.waiting)
            or not nodes.accepts(load.node_id)
        )


@dataclasses.dataclass(slots=True)
class _PerList:
    """The answers placement keeps for one node list. A node source keeps its list until
    something in it changes (a new one then), and every placement, poll and load asks for
    each node's capacity, every submission whether its job could ever fit: worked out once
    per list, not on every call."""

    nodes: Nodes | None
    capacities: dict[str, Capacity] = dataclasses.field(default_factory=dict)
    never_fits: dict[fit.Shape, str | None] = dataclasses.field(default_factory=dict)


def _candidates(healthy: tuple[str, ...], avoid: str | None) -> tuple[str, ...]:
    if avoid is not None and len(healthy) > 1 and avoid in healthy:
        return tuple(node for node in healthy if node != avoid)
    return healthy


def _load(queued: int, used: int, slots: int) -> Fraction:
    """A node's load, (queued + used) / slots, exact: equal loads must compare equal for the
    tie rule."""
    return Fraction(queued + used, slots)
