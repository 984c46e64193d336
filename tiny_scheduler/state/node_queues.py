"""Each node's active jobs, indexed the ways the hot paths read them: the jobs it hands out
(due, in the poll's order), its running jobs, its slots in use and its load, and the jobs an
idle node may take over from it.

- due pending jobs per node by id (listings), and the same by `order` (priority, then age)
  split by queue and owner, so the poll reads exactly the jobs it hands out, a queue that is
  paused or at its limit is skipped whole, and so is a user at its limit; the streams are
  merged by the fair-share key (`fair_share.order_key`: priority, the owner's usage, age),
  which within one owner's stream is `order`. Each queue's due jobs cluster-wide by owner and
  `order`, so a limited queue with room hands out only its head (its next place goes to its
  first job in that key, wherever that waits);
- running jobs per node, and what is allocated on each node (`fit.need_of` of its running
  jobs and of timed-out ones whose process still runs there), so what a node has free is
  one lookup;
- what the due jobs of each node need, in all and per queue, so a node's load is two
  lookups;
- per node the due jobs an idle node may take over (`jobs.can_move`), by `order`;
- per node the timed-out jobs that still hold a slot.

Not thread-safe by itself: the job table keeps it in step under its lock. Tests: through
`tests/test_table.py`, which owns every rule these indexes serve.
"""

from __future__ import annotations

import collections
import heapq
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from sortedcontainers import SortedDict

from ..domain import jobs
from ..domain.fit import NOTHING, Resources, need_of
from ..domain.jobs import Job
from .jobs_by_node import JobsByNode, fresh_index, retire_index


def order(job: Job) -> tuple[int, int]:
    """The order of one owner's due jobs: higher priority first, then oldest first (across
    owners, the fair-share key decides: `fair_share.order_key`)."""
    return (-job.priority, job.seq)


Key = Callable[[Job], Any]
"""The key due jobs of several owners are merged by (`fair_share.order_key`)."""

Stream = tuple[str, str]
"""A node's due jobs are kept in one index per (queue, owner)."""


class NodeQueues:
    """The active jobs of every node."""

    def __init__(self) -> None:
        self.due = JobsByNode()  # due pending jobs
        self._ready: dict[str, dict[Stream, SortedDict]] = {}  # node -> stream -> by order
        self._queue_ready: dict[str, dict[str, SortedDict]] = {}  # queue -> owner -> by order
        self._user_ready: dict[str, SortedDict] = {}  # owner -> its due jobs, by order
        self.running = JobsByNode()
        self.held = JobsByNode()  # timed-out jobs keeping a slot
        self._movable: dict[str, dict[Stream, SortedDict]] = {}  # node -> stream -> by order
        self.allocated: dict[str, Resources] = {}  # node -> what its running jobs take
        self._waiting: dict[str, Resources] = {}  # node -> what its due jobs need
        self._waiting_by_queue: dict[tuple[str, str], Resources] = {}

    # --- upkeep -----------------------------------------------------------------------------

    def add_due(self, job: Job) -> None:
        node, key, stream = job.node_id, order(job), (job.queue, job.owner)
        self.due.add(job)
        _queue(_queues_of(self._ready, node), stream)[key] = job
        _queue(_queues_of(self._queue_ready, job.queue), job.owner)[key] = job
        _queue(self._user_ready, job.owner)[key] = job
        need = need_of(job)
        _add(self._waiting, node, need)
        _add(self._waiting_by_queue, (node, job.queue), need)
        if jobs.can_move(job):
            _queue(_queues_of(self._movable, node), stream)[key] = job

    def remove_due(self, job: Job) -> None:
        node, key, stream = job.node_id, order(job), (job.queue, job.owner)
        self.due.discard(job)
        _discard_nested(self._ready, node, stream, key)
        _discard_nested(self._queue_ready, job.queue, job.owner, key)
        _discard(self._user_ready, job.owner, key)
        need = need_of(job)
        _subtract(self._waiting, node, need)
        _subtract(self._waiting_by_queue, (node, job.queue), need)
        if jobs.can_move(job):
            _discard_nested(self._movable, node, stream, key)

    def add_running(self, job: Job) -> None:
        self.running.add(job)

    def remove_running(self, job: Job) -> None:
        self.running.discard(job)

    def add_slot_facts(self, job: Job) -> None:
        """What any version of a job says about what its node has allocated (whatever its
        status): a running job, or a timed-out one whose process may still run there."""
        if job.holds_slot:
            self.held.add(job)
        if job.status == jobs.RUNNING or job.holds_slot:
            _add(self.allocated, job.node_id, need_of(job))

    def remove_slot_facts(self, job: Job) -> None:
        if job.holds_slot:
            self.held.discard(job)
        if job.status == jobs.RUNNING or job.holds_slot:
            _subtract(self.allocated, job.node_id, need_of(job))

    # --- reads ------------------------------------------------------------------------------

    def handed_out(
        self,
        node_id: str,
        room: Callable[[str], int | None],
        user_room: Callable[[str], int | None],
        key: Key,
        eligible: Callable[[Job], bool] | None = None,
        movable: bool = False,
    ) -> Iterator[Job]:
        """A node's due jobs (with `movable`: only those an idle node may take) in the order
        they are handed out (`key`), over its queues and owners: every job of a queue with no
        limit (`room` of the queue None); of a limited queue with room only those of its head
        (its first `room` jobs cluster-wide by `key`) that are on this node and `eligible`; of
        a queue with no room none; none of an owner whose `user_room` is 0, and of an owner
        with a limit (in queues without one) only those of its own head, the same way. Reads
        only what it yields, plus the heads of limited queues and users."""
        by_stream = (self._movable if movable else self._ready).get(node_id)
        if not by_stream:
            return iter(())
        streams: list[Iterator[Job]] = []
        limited: set[str] = set()
        limited_users: set[str] = set()
        for (name, owner), index in by_stream.items():
            user_space = user_room(owner)
            if user_space == 0:
                continue
            space = room(name)
            if space is None and user_space is None:
                streams.append(iter(index.values()))
            elif space is None and owner not in limited_users:
                limited_users.add(owner)
                assert user_space is not None
                user_head = itertools.islice(self._user_ready[owner].values(), user_space)
                streams.append(
                    job
                    for job in user_head
                    if job.node_id == node_id
                    and room(job.queue) is None  # a limited queue's jobs come by its head
                    and (eligible is None or eligible(job))
                )
            elif space > 0 and name not in limited:
                limited.add(name)
                owners = self._queue_ready[name]
                everywhere = _merged(
                    [iter(i.values()) for o, i in owners.items() if user_room(o) != 0], key
                )
                head = itertools.islice(everywhere, space)
                streams.append(
                    job
                    for job in head
                    if job.node_id == node_id and (eligible is None or eligible(job))
                )
        return _merged(streams, key)

    def loads(
        self, node_ids: Sequence[str], held_back: Sequence[str]
    ) -> dict[str, tuple[Resources, Resources]]:
        """For each node: (what its due jobs that could start need, what it has allocated).
        The jobs of a queue in `held_back` (which hands nothing out now) would wait whatever
        the node."""
        waiting, allocated = self._waiting, self.allocated
        loads = {
            node: (waiting.get(node, NOTHING), allocated.get(node, NOTHING)) for node in node_ids
        }
        if held_back:
            by_queue = self._waiting_by_queue
            for node, (need, in_use) in loads.items():
                for name in held_back:
                    need = need - by_queue.get((node, name), NOTHING)
                loads[node] = (need, in_use)
        return loads

    def movable_nodes(self) -> list[str]:
        return list(self._movable)


def _add(sums: dict[Any, Resources], key: Any, amount: Resources) -> None:
    if amount != NOTHING:  # a service that asks for nothing: no entry to keep
        sums[key] = sums.get(key, NOTHING) + amount


def _subtract(sums: dict[Any, Resources], key: Any, amount: Resources) -> None:
    """Less of `key`; a sum that reaches nothing is dropped (nodes and queues come and go)."""
    if amount == NOTHING:
        return
    left = sums[key] - amount
    if left == NOTHING:
        del sums[key]
    else:
        sums[key] = left


def decrement(counter: collections.Counter[Any], key: Any) -> None:
    """One less of `key`; a count that reaches zero is dropped (nodes and queues come and
    go: no zero is kept for each forever)."""
    counter[key] -= 1
    if not counter[key]:
        del counter[key]


def _merged(streams: list[Iterator[Job]], key: Key) -> Iterator[Job]:
    if not streams:
        return iter(())
    if len(streams) == 1:
        return streams[0]
    return heapq.merge(*streams, key=key)


def _queue(index: dict[Any, SortedDict], key: Any) -> SortedDict:
    """The index's entry for `key`, made when it has none (not made on every call, as
    `setdefault`'s argument would be), from an emptied one when there is one."""
    queue = index.get(key)
    if queue is None:
        queue = index[key] = fresh_index()
    return queue


def _queues_of(index: dict[str, dict[Any, SortedDict]], node_id: str) -> dict[Any, SortedDict]:
    found = index.get(node_id)
    if found is None:
        found = index[node_id] = {}
    return found


def _discard_nested(
    index: dict[str, dict[Any, SortedDict]], outer: str, inner: Any, key: object
) -> None:
    by_inner = index[outer]
    _discard(by_inner, inner, key)
    if not by_inner:
        del index[outer]


def _discard(index: dict[Any, SortedDict], key: Any, member: object) -> None:
    queue = index[key]
    del queue[member]
    if not queue:
        del index[key]
        retire_index(queue)
