"""Nodes as the scheduler itself knows them: agents' heartbeats (with what they run and what
they must stop), drains, and the node listing.

- A **heartbeat** records the node in the book (and in the store when its facts changed), and
  answers with the node's orders: `drain`, and `stop`, the jobs it runs that must end (the
  scheduler ended them: cancelled or timed out, or they are not the node's any more). It is
  also evidence: a job the scheduler has `running` there that two heartbeats in a row leave
  out is not running anywhere; it fails as lost by its agent (the retry rule applies).
- A **drain** is stored, takes the node out of placement at once and moves its pending jobs
  (not pinned ones) elsewhere; its running jobs finish.
- The **listing** joins the node source's list, the heartbeats, the drains and the jobs.

Tests: `tests/test_node_decisions.py`, `tests/test_nodes_api.py`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Iterator
from typing import Any

from .. import errors
from ..cluster.node_book import Beat, NodeBook
from ..cluster.node_requests import NODE_NOT_FOUND, Heartbeat
from ..domain import fencing, fit, jobs
from ..domain.fit import NOTHING, Resources
from ..domain.jobs import Job
from ..domain.nodes import NodeRecord, Nodes
from . import moves
from .core import Core
from .dispatch import Dispatch, Handed
from .lifecycle import Lifecycle
from .node_waits import NodeWaits

log = logging.getLogger("tiny_scheduler.service")


@dataclasses.dataclass(frozen=True, slots=True)
class NodeView:
    """One node as `GET /nodes` shows it."""

    node_id: str
    health: str  # healthy, unhealthy, gone
    source: str  # registry or heartbeat
    slots: int
    running: int
    pending: int
    drain: bool
    last_heartbeat_at: int | None = None
    cpu_count: int | None = None
    labels: dict[str, str] | None = None
    version: str = ""
    refusing_work: str = ""
    capacity: Resources = NOTHING  # what it has (memory left out when nobody reported it)
    allocated: Resources = NOTHING  # what its running jobs take
    enforcement: str = ""  # how its agent enforces jobs' limits (cgroup-v2, cgroup-v1, none)

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "node_id": self.node_id,
            "health": self.health,
            "source": self.source,
            "slots": self.slots,
            "running": self.running,
            "pending": self.pending,
            "drain": self.drain,
        }
        if self.last_heartbeat_at is not None:
            out["last_heartbeat_at"] = jobs.format_time(self.last_heartbeat_at)
        if self.cpu_count is not None:
            out["cpu_count"] = self.cpu_count
        if self.labels:
            out["labels"] = self.labels
        if self.version:
            out["version"] = self.version
        if self.refusing_work:
            out["refusing_work"] = self.refusing_work
        out["capacity"] = self.capacity.to_wire()
        out["allocated"] = self.allocated.to_wire()
        if "memory_mb" not in out["capacity"]:
            out["allocated"].pop("memory_mb")  # no total to compare it with
        if self.enforcement:
            out["enforcement"] = self.enforcement
        return out


@dataclasses.dataclass(frozen=True, slots=True)
class Orders:
    """The answer to a heartbeat."""

    node_id: str
    heartbeat_secs: float
    drain: bool
    stop: list[str]
    # What an agent needs for its fence and its own timeouts (round four).
    node_lost_secs: float = 0.0
    job_timeout_secs: int = 0

    def to_wire(self, jobs_handed: list[Job] | None = None) -> dict[str, Any]:
        """The answer; a waiting heartbeat's also has `jobs`, the jobs handed to the node,
        each as the poll shows it."""
        out: dict[str, Any] = {
            "node_id": self.node_id,
            "heartbeat_secs": _number(self.heartbeat_secs),
            "drain": self.drain,
            "stop": self.stop,
            "node_lost_secs": _number(self.node_lost_secs),
            "job_timeout_secs": self.job_timeout_secs,
        }
        if jobs_handed is not None:
            out["jobs"] = [job.to_wire() for job in jobs_handed]
        return out


def _number(secs: float) -> float | int:
    """Whole seconds as an integer on the wire (5, not 5.0)."""
    return int(secs) if secs == int(secs) else secs


class NodeOps:
    """Heartbeats, drains and the node listing."""

    def __init__(
        self,
        core: Core,
        lifecycle: Lifecycle,
        dispatch: Dispatch,
        book: NodeBook,
        builtin: bool,
        waits: NodeWaits,
    ) -> None:
        self._core = core
        self._lifecycle = lifecycle
        self._dispatch = dispatch
        self.book = book
        self._builtin = builtin  # the heartbeats are the node list (REGISTRY_URL=builtin)
        self._records: dict[str, NodeRecord] = {}  # as stored
        self.waits = waits

    def load(self, records: list[NodeRecord]) -> None:
        """Start a term (or the daemon) with the stored nodes, each counted as seen now."""
        self.book.forget_all()
        self._records = {record.node_id: record for record in records}
        for record in records:
            beat = Beat(
                0.0,
                record.seen_at,
                record.cpu_count,
                frozenset(),
                record.version,
                record.labels,
                memory_mb=record.memory_mb,
                gpus=record.gpus,
                enforcement=record.enforcement,
            )
            self.book.restore(record.node_id, beat, record.drain)

    def forget(self) -> None:
        self.book.forget_all()
        self._records = {}

    # --- heartbeats ----------------------------------------------------------------------

    def heartbeat(self, node_id: str, beat: Heartbeat) -> Orders:
        """An agent's heartbeat: its node's facts stored when they changed, what it runs
        compared with what the scheduler has running there (a job left out twice is lost),
        and the node's orders. May wait (a commit): a thread's."""
        orders = self._heartbeat(node_id, beat, in_memory=False)
        assert orders is not None
        return orders

    def heartbeat_in_memory(self, node_id: str, beat: Heartbeat) -> Orders | None:
        """The same heartbeat when it can be answered from memory alone (the worker's loop
        answers it): None, before anything changed, when the node's facts changed (a
        commit) or the agent left out a job it should run (a miss is counted once, and may
        fail the job): then `heartbeat` on a thread."""
        return self._heartbeat(node_id, beat, in_memory=True)

    def _heartbeat(self, node_id: str, beat: Heartbeat, in_memory: bool) -> Orders | None:
        core = self._core
        book = self.book
        if book.other_agent(node_id, beat.agent_id):
            # Checked before anything changes: the second agent must run nothing here.
            raise errors.Conflict(f"node {node_id} is served by another agent")
        now_us = core.now()
        old = self._records.get(node_id)
        record = NodeRecord(
            node_id,
            beat.cpu_count,
            beat.labels,
            beat.version,
            drain=old.drain if old else False,
            seen_at=now_us,
            memory_mb=beat.memory_mb,
            gpus=beat.gpus or 0,
            enforcement=beat.enforcement,
        )
        changed = old is None or dataclasses.replace(old, seen_at=now_us) != record
        # Read once: the loop must decide on the very list it reconciles (a claim between two
        # reads could otherwise count a miss there, and a second miss fails a job: a commit).
        running = self._core.table.running_on(node_id)
        if in_memory and (changed or any(job.job_id not in beat.running for job in running)):
            return None
        if changed:
            core.store.save_nodes(record)  # the facts changed: durable before the answer
            self._records[node_id] = record
        book.beat(
            node_id,
            Beat(
                core.clock.monotonic(),
                now_us,
                beat.cpu_count,
                beat.running,
                beat.version,
                beat.labels,
                beat.fence_secs,
                beat.agent_id,
                beat.refusing_work,
                beat.memory_mb,
                beat.gpus or 0,
                beat.enforcement,
            ),
        )
        self._reconcile(node_id, running, beat.running)
        return self.orders(node_id, beat)

    def orders(self, node_id: str, beat: Heartbeat) -> Orders:
        """The node's orders as they stand now for the jobs its heartbeat listed: a read,
        from memory. A waiting heartbeat's effects happened when it arrived; when it is
        answered later, its orders are read again here."""
        settings = self._core.settings
        return Orders(
            node_id,
            settings.node_heartbeat_secs,
            node_id in self.book.drained(),
            self._stop_orders(node_id, beat.running, dict(beat.attempts)),
            settings.node_lost_secs,
            settings.job_timeout_secs,
        )

    def woken_want(self, node_id: str, beat: Heartbeat) -> int | None:
        """The free slots a woken waiting heartbeat is answered for: what its `want` said,
        plus the CPUs of the jobs it listed that its node's reports have ended since. Without
        this, a full node's wait (`want: 0`) woken by a job's end would answer empty, and its
        agent would ask again for the slot that freed: a round trip on every job's path. A
        listed job whose report was already on its way when the agent counted its slot free
        is counted twice; what is handed out stays within the node's free capacity as the
        scheduler counts it, so that gives the node no more than it has."""
        if beat.want is None:
            return None
        freed = sum(fit.need_of(job).cpus for job in self._reported(node_id, beat.running))
        return beat.want + freed

    def has_news(self, orders: Orders, handed: Handed, woken: bool) -> bool:
        """Whether a waiting heartbeat answers now rather than wait on: it has jobs to hand
        out, a stop order, or a drain its agent was not told yet; or, woken by a change, the
        node could start more than the agent's `want` let through (a slot came free since
        it asked: it asks again with its new count). Not on arrival: an agent whose count
        differs from ours would then ask again and again at once.

        A stop order for a job that its node's own report ended is no news: the agent
        listed it because that report's answer had not reached it yet, and has nothing left
        to stop (the order still goes with whatever answer comes)."""
        reported = {job.job_id for job in self._reported(orders.node_id, orders.stop)}
        return bool(
            handed.jobs
            or any(job_id not in reported for job_id in orders.stop)
            or self.waits.drain_news(orders.node_id, orders.drain)
            or (woken and handed.more)
        )

    def _reported(self, node_id: str, listed: Iterable[str]) -> list[Job]:
        """The jobs of `listed` that a report from the node ended (`jobs.ended_by_report`)."""
        found = []
        for _, job in self._listed(listed):
            if job is not None and job.node_id == node_id and jobs.ended_by_report(job):
                found.append(job)
        return found

    def _listed(self, listed: Iterable[str]) -> Iterator[tuple[str, Job | None]]:
        """Each job id a heartbeat listed, with the job it names (None: unknown here)."""
        table = self._core.table
        for job_id in listed:
            seq = jobs.parse_job_id(job_id)
            yield job_id, table.get(seq) if seq is not None else None

    def _reconcile(self, node_id: str, running: list[Job], listed: frozenset[str]) -> None:
        lost = self.book.missing([job.job_id for job in running], listed)
        for job_id in lost:
            seq = jobs.parse_job_id(job_id)
            assert seq is not None
            failed = self._lifecycle.fail_running(seq, jobs.Reason.NODE_LOST, moves.LOST_BY_AGENT)
            if failed is not None:
                log.warning("job %s: node %s's agent no longer runs it", job_id, node_id)

    def _stop_orders(
        self, node_id: str, listed: frozenset[str], attempts: dict[str, int]
    ) -> list[str]:
        """What the node must stop: each job its agent runs that is not running there as far
        as the scheduler knows: ended by the scheduler while it ran (cancelled, timed out),
        failed as lost and retried elsewhere (or here: the agent runs an older attempt than
        the current one), or forgotten altogether."""
        stop = []
        for job_id, job in self._listed(listed):
            if (
                job is None
                or job.node_id != node_id
                or job.status != jobs.RUNNING
                or attempts.get(job_id, job.retry_count) != job.retry_count
            ):
                stop.append(job_id)
        return sorted(stop, key=lambda job_id: jobs.parse_job_id(job_id) or 0)

    def fence_holds(self) -> dict[str, float]:
        """For each node whose agent fences: the moment (the book's monotonic clock) before
        which its running jobs may not be given up, because its fence may not have stopped
        them yet (`fencing.lost_at`)."""
        settings = self._core.settings
        return {
            node_id: fencing.lost_at(
                beat.at, beat.fence_secs, settings.node_heartbeat_secs, settings.node_lost_secs
            )
            for node_id, beat in self.book.beats().items()
            if beat.fence_secs is not None
        }

    # --- drains --------------------------------------------------------------------------

    def set_drain(self, node_id: str, drain: bool) -> NodeView:
        """Drain a node, or undrain it; NotFound for a node nobody ever heard of."""
        core = self._core
        if node_id not in self._known():
            raise errors.NotFound(NODE_NOT_FOUND)
        old = self._records.get(node_id) or NodeRecord(node_id, seen_at=core.now())
        if old.drain != drain:
            record = dataclasses.replace(old, drain=drain)
            core.store.save_nodes(record)
            self._records[node_id] = record
        self.book.set_drain(node_id, drain)
        self.waits.wake(node_id)
        if drain:
            log.info("node %s drained", node_id)
            for job in core.table.on_node(node_id).pending:
                try:
                    self._dispatch.move_pending(job.seq)  # pinned jobs stay
                except errors.ServiceError as exc:
                    log.warning("drain of %s: job %s stays: %s", node_id, job.job_id, exc)
        else:
            log.info("node %s undrained", node_id)
        return self.get(node_id)

    # --- the listing ---------------------------------------------------------------------

    def listing(self) -> list[NodeView]:
        """Every known node, sorted by id."""
        cached = self._shown_nodes()
        return [self._view(node_id, cached) for node_id in sorted(self._known(cached))]

    def get(self, node_id: str) -> NodeView:
        cached = self._shown_nodes()
        if node_id not in self._known(cached):
            raise errors.NotFound(NODE_NOT_FOUND)
        return self._view(node_id, cached)

    def _shown_nodes(self) -> Nodes | None:
        """The node list the listing shows: a registry's last answer (never a peer call
        here); the heartbeats' own list as it is now, which memory makes at once (its cached
        copy, the poll's, may lag a node that just registered: `BuiltinNodes`)."""
        source = self._core.placement.source
        return source.nodes() if self._builtin else source.cached_nodes()

    def is_listed_in_memory(self, node_id: str) -> bool | None:
        """Whether the node source's last list names the node; None when it does not (or
        there is none yet): then ask `is_listed`, which may fetch a fresh one."""
        cached = self._core.placement.source.cached_nodes()
        return True if cached is not None and node_id in cached.status else None

    def is_listed(self, node_id: str) -> bool:
        """Whether the node source names the node (healthy or not), asking it afresh when
        the last list does not: a node just added to the registry is listed at once. May
        wait on the registry, within its deadline; a registry that cannot answer lists
        nothing new."""
        if self.is_listed_in_memory(node_id):
            return True
        try:
            return node_id in self._core.placement.source.nodes().status
        except errors.PlacementError:
            return False

    def _known(self, cached: Nodes | None = None) -> set[str]:
        if cached is None:
            cached = self._core.placement.source.cached_nodes()
        known = set(self.book.beats()) | set(self._records) | self._core.table.busy_nodes()
        if cached is not None:
            known |= set(cached.status)
        return known

    def _view(self, node_id: str, cached: Nodes | None) -> NodeView:
        core = self._core
        beat = self.book.last_beat(node_id)
        listed = cached is not None and node_id in cached.status
        if self._builtin or not listed:
            health = self.book.health(beat) if beat is not None else "gone"
            if not self._builtin and beat is None:
                health = "gone"
        else:
            health = cached.status[node_id]  # type: ignore[union-attr]
        pending, running = core.table.node_counts(node_id)
        (load,) = core.placement.loads([node_id], cached)
        return NodeView(
            node_id=node_id,
            health=health,
            source="registry" if listed and not self._builtin else "heartbeat",
            slots=core.placement.slots(node_id, cached),
            running=running,
            pending=pending,
            drain=node_id in self.book.drained(),
            last_heartbeat_at=beat.at_us if beat is not None else None,
            cpu_count=beat.cpu_count if beat is not None else None,
            labels=dict(beat.labels) if beat is not None and beat.labels else None,
            version=beat.version if beat is not None else "",
            refusing_work=beat.refusing_work if beat is not None else "",
            capacity=load.total,
            allocated=load.allocated,
            enforcement=beat.enforcement if beat is not None else "",
        )
