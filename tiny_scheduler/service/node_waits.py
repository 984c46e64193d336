"""Which agents wait in a heartbeat for work, and waking exactly the ones a change concerns.

An agent of ours heartbeats with `wait_secs` (spec, "Waiting for work"): its answer waits in
the worker's loop until there is something to tell it. Each node has a `Signal` of its own,
fired by the changes that may give its waiting heartbeat something to say:

- a job placed on the node, moved to it, retried there or released there (work to hand out);
- a job of the node ending (a slot free again; a stop order when the scheduler ended it
  while it ran);
- a drain or undrain of the node (`wake`, from node_ops).

A job placed on a node that cannot start it (`moves.donors`: no free slot, unhealthy, gone)
also wakes one node whose agent waits with free slots (`want` above 0), the longest waiting
first, so that its heartbeat may take the job over as its poll would. One, not all: 5,000
waiting agents must not all run again for every job. Should that one not take it (it does
not fit there), the job waits for the next heartbeat renewed, at most a heartbeat period.

A job's end also wakes the nodes of the dependents it made due (their dependencies met):
a workflow's next step starts as soon as the step before it ends, not at the next renewal.
A delayed job's `not_before` is a deadline of its node's wait instead (`api/nodes.py`): the
wait answers then, and its renewal hands the job out.

It also remembers the drain each node's agent was last told, so that a heartbeat woken by a
drain change knows it has news.

Tests: `tests/test_node_waits.py`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from ..domain.jobs import Job
from ..notify import Signal
from .core import Event

PENDING_EVENTS = frozenset({Event.SUBMITTED, Event.MOVED, Event.RETRIED, Event.RELEASED})
"""Changes after which the job waits, due or soon, on its node."""

ENDING_EVENTS = frozenset({Event.FINISHED})
"""Changes after which the job's node has its slot back (or a stop order to give)."""


class NodeWaits:
    """Per node: the signal its waiting heartbeat parks on, whether it waits with free slots,
    and the drain its agent was last told."""

    def __init__(
        self,
        gives_work: Callable[[str], bool],
        released_nodes: Callable[[], Iterable[str]] = frozenset,
    ) -> None:
        """`gives_work(node_id)`: whether the node's waiting jobs may go to an idle node
        (it cannot start them itself): then a hungry node is woken too. `released_nodes()`:
        the nodes of the dependents made due since it was last asked
        (`JobTable.take_released_nodes`)."""
        self._gives_work = gives_work
        self._released_nodes = released_nodes
        self._lock = threading.Lock()
        self._signals: dict[str, Signal] = {}
        self._hungry: dict[str, None] = {}  # parked with want > 0, longest waiting first
        self._told_drain: dict[str, bool] = {}
        self.wakes = 0  # signals fired, for tests and the benchmark

    def signal(self, node_id: str) -> Signal:
        with self._lock:
            found = self._signals.get(node_id)
            if found is None:
                found = self._signals[node_id] = Signal()
            return found

    def parked(self, node_id: str, want: int) -> Callable[[], None]:
        """A heartbeat of the node parks; what to call when its wait is over."""
        if want > 0:
            with self._lock:
                self._hungry.pop(node_id, None)
                self._hungry[node_id] = None

        def left() -> None:
            with self._lock:
                self._hungry.pop(node_id, None)

        return left

    def told(self, node_id: str, drain: bool) -> None:
        """The node's agent was answered with this drain."""
        with self._lock:
            self._told_drain[node_id] = drain

    def drain_news(self, node_id: str, drain: bool) -> bool:
        """Whether `drain` differs from what the node's agent was last told (news too when
        it was told nothing yet, by this daemon)."""
        with self._lock:
            return self._told_drain.get(node_id) != drain

    def wake(self, node_id: str) -> None:
        """Wake the node's waiting heartbeat, if any (cheap when none waits)."""
        with self._lock:
            found = self._signals.get(node_id)
        if found is not None:
            self.wakes += 1
            found.fire()

    def on_change(self, event: Event, job: Job | None, detail: str) -> None:
        """A committed change (a listener of the core): wake the nodes it concerns."""
        if job is None or not job.node_id:
            return
        if event in ENDING_EVENTS:
            self.wake(job.node_id)
            for node_id in self._released_nodes():
                self.wake(node_id)
                self._wake_a_taker(node_id)
        elif event in PENDING_EVENTS:
            self.wake(job.node_id)
            self._wake_a_taker(job.node_id)

    def _wake_a_taker(self, node_id: str) -> None:
        """A job waits on `node_id`: if that node cannot start it, wake the node that has
        waited longest with free slots (it goes to the back of the line)."""
        with self._lock:
            taker = next((node for node in self._hungry if node != node_id), None)
        if taker is None or not self._gives_work(node_id):
            return
        with self._lock:
            if self._hungry.pop(taker, 0) is None:
                self._hungry[taker] = None
        self.wake(taker)
