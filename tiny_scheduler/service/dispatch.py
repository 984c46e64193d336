"""Handing work out and moving it: the agent poll, idle nodes taking waiting jobs, pending
jobs of a node that went down placed again, and what a poll proves about claimed jobs.

What moves where is decided in `moves` (pure); this part reads the table, holds the jobs
busy while it checks them again, and hands the moves to the core's committer.

Tests: `tests/test_moving_work.py`, `tests/test_agent_cycle.py`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging

from .. import errors
from ..cluster.node_book import NodeBook
from ..domain import fit, jobs
from ..domain.jobs import Job
from ..domain.nodes import Nodes
from . import moves
from .core import Core, Event, Move
from .lifecycle import Lifecycle

log = logging.getLogger("tiny_scheduler.service")


@dataclasses.dataclass(frozen=True, slots=True)
class Handed:
    """The jobs a poll (or a waiting heartbeat) hands out, and whether the node has more it
    could start than its agent's `want` let through (its agent should ask again)."""

    jobs: list[Job]
    more: bool = False


class Dispatch:
    """The poll and the moving of waiting work."""

    def __init__(self, core: Core, lifecycle: Lifecycle, book: NodeBook) -> None:
        self._core = core
        self._lifecycle = lifecycle
        # A node whose agent heartbeats says what it runs there: its polls prove nothing.
        self._book = book

    def poll(self, node_id: str, from_agent: bool = False) -> list[Job]:
        """The agent poll: the node's pending jobs that are due, by priority then age (a
        delayed job waits for its not_before), at most as many as its free slots; with
        JOB_STEALING, free slots its own queue cannot fill are topped up with the first due
        waiting jobs (by priority, then age) of nodes that cannot start them (moved here
        before this returns). `from_agent`: the poll came without a key, as the tiny-aws
        agent's does, so it is evidence of what the node runs (`moves.claims_disproved`):
        claims it disproves are failed first. May wait (busy jobs, commits): a thread's."""
        answer = self._poll(node_id, from_agent, in_memory=False)
        assert answer is not None
        return answer.jobs

    def poll_in_memory(self, node_id: str, from_agent: bool = False) -> list[Job] | None:
        """The same poll when it can be answered from memory alone, changing nothing stored
        and waiting for nothing (the worker's loop answers it); None, before anything
        changed, when it would fail a disproved claim or move work: then `poll` it on a
        thread."""
        answer = self._poll(node_id, from_agent, in_memory=True)
        return None if answer is None else answer.jobs

    def hand(self, node_id: str, want: int | None) -> Handed:
        """What a waiting heartbeat hands its node (spec, "Waiting for work"): the poll's
        answer for the node, capped by the `want` free slots its agent says it has (a job
        takes its CPUs of them, a service none). May wait, as `poll`: a thread's."""
        answer = self._poll(node_id, False, in_memory=False, want=want)
        assert answer is not None
        return answer

    def next_due_in(self, node_id: str) -> float | None:
        """Seconds until the node's first delayed job comes due (its `not_before`), or None:
        a waiting heartbeat answers by then, so that its renewal hands the job out."""
        now = self._core.now()
        due_at = self._core.table.next_due_on(node_id, now)
        return None if due_at is None else (due_at - now) / 1_000_000

    def hand_in_memory(self, node_id: str, want: int | None) -> Handed | None:
        """`hand` from memory alone, or None (nothing changed) when it would move work."""
        return self._poll(node_id, False, in_memory=True, want=want)

    def _poll(
        self, node_id: str, from_agent: bool, in_memory: bool, want: int | None = None
    ) -> Handed | None:
        core = self._core
        table = core.table
        placement = core.placement
        now = core.now()
        if from_agent and self._book.last_beat(node_id) is None:
            disproved = moves.claims_disproved(table.running_on(node_id), now)
            if disproved and in_memory:
                return None
            self._fail_disproved(node_id, disproved)
        nodes = placement.source.cached_nodes()  # never a registry call on this path
        capacity = placement.capacity(node_id, nodes)
        stealing = core.settings.job_stealing
        limit = capacity.total.cpus if want is None else min(want, capacity.total.cpus)
        # Remembering the offer is a memory cache: a second look on a thread renews it.
        own, picker = table.poll(capacity, now, core.expected_end, remember=stealing)
        found = own if want is None else moves.within_slots(own, want)
        if stealing and nodes is not None and placement.may_take(node_id, nodes):
            wanted = limit - len(found)
            candidates = (
                self._candidates(node_id, nodes, picker, wanted, now)
                if wanted > 0 and not picker.exhausted and len(found) == len(own)
                else []
            )
            if candidates and in_memory:
                return None
            if candidates:
                taken = self._take_over(node_id, candidates, now)
                found += taken if want is None else moves.within_slots(taken, want, found)
        core.emit(Event.POLLED, None, node_id)
        return Handed(found, more=len(found) < len(own))

    def _fail_disproved(self, node_id: str, disproved: list[Job]) -> None:
        for job in disproved:
            try:
                failed = self._lifecycle.fail_running(
                    job.seq, jobs.Reason.NODE_LOST, moves.LOST_BY_AGENT
                )
            except errors.ServiceError as exc:
                # The poll is a read and goes on when the store cannot write: the scan or the
                # next poll tries again.
                log.warning("poll of node %s: job %s not failed: %s", node_id, job.job_id, exc)
                continue
            if failed is not None:
                log.warning(
                    "job %s: node %s polled while it should be running it; lost by its agent",
                    job.job_id,
                    node_id,
                )

    def move_pending(self, seq: int) -> Job | None:
        """Place a pending job again (its node is gone); None when it is no longer pending
        or no other node can take it."""
        core = self._core
        with core.table.changing(seq) as job:
            if job.status != jobs.PENDING or job.instance_id:
                return None
            # A retry does not go back to the node it failed on while a third node can take it.
            failed_on = job.attempts[-1].node_id if job.attempts else None
            node_id = core.placement.place(avoid=job.node_id, wants=job, rather_not=failed_on)
            if node_id == job.node_id:
                return None
            new = job.evolve(node_id=node_id, moved_from=job.node_id)
            core.commit(new)
        log.info("job %s moved from node %s to %s (node down)", job.job_id, job.node_id, node_id)
        core.emit(Event.MOVED, new, Move.NODE_DOWN)
        return new

    def _candidates(
        self, node_id: str, nodes: Nodes, picker: fit.Picker, wanted: int, now: int
    ) -> list[Job]:
        """Up to `wanted` of the first waiting jobs (by priority, then age) of nodes that
        cannot start them, which `node_id` may take over (`picker`, its own, says which fit
        there): a read."""
        table = self._core.table
        others = [node for node in table.movable_nodes() if node != node_id]
        if not others:
            return []
        loads = self._core.placement.loads(others, nodes, now)
        donors = moves.donors(loads, nodes)
        if not donors:
            return []
        stays = moves.stays_where_it_is(loads, nodes)
        return table.movable(donors, now, picker, stays, wanted)

    def _take_over(self, node_id: str, candidates: list[Job], now: int) -> list[Job]:
        """Move the candidates that are still movable to `node_id`, committed before this
        returns; the moved jobs, in the poll's order.

        A job is checked again once it is held busy: its old node's agent may have claimed
        it, or been offered it, since the candidates were read. The claim and the move take
        turns on the same busy marker, so exactly one of them happens to a pending job.
        """
        core = self._core
        table = core.table
        moved: list[Job] = []
        with contextlib.ExitStack() as held:
            # Held in id order (they come by priority), as every other poll's take-over: two of
            # them never wait for each other's busy jobs in a circle. (A failure's cascade also
            # holds several, but only jobs waiting for dependencies, which never move.)
            for candidate in sorted(candidates, key=_seq_of):
                job = held.enter_context(table.changing(candidate.seq))
                if moves.still_movable(job, candidate, table.just_offered(job, now), node_id):
                    moved.append(job.evolve(node_id=node_id, moved_from=job.node_id))
            moved.sort(key=table.ordering(now))  # the poll's order: they join the node's own
            if not moved:
                return []
            try:
                core.commit_all(moved)
            except errors.StoreError as exc:
                # The poll is a read and goes on from memory when the store cannot write
                # (the contract): the node gets its own jobs, the others stay where they are.
                log.warning("poll of node %s: jobs not moved: %s", node_id, exc.message)
                return []
            table.offered(node_id, moved, now)
        for job in moved:
            log.info(
                "job %s moved from node %s to idle node %s", job.job_id, job.moved_from, node_id
            )
            core.emit(Event.MOVED, job, Move.STOLEN)
        return moved


def _seq_of(job: Job) -> int:
    return job.seq
