"""The replay: past jobs run again, event by event on a virtual clock, through the real service.

`VirtualCluster` is one scheduler in memory (a store that keeps nothing, a `ManualClock`, its
nodes the agents that heartbeat, as with `REGISTRY_URL=builtin`), with the queues' and users'
limits of the `Setup` stored as an operator would set them. `replay` moves its clock straight
to the next event, never idling between:

1. every node whose last heartbeat is a period old beats (listing what it runs), so each
   stays healthy without a beat at every step (the period is an hour: no node is lost);
2. the jobs that end now are reported (done, or failed as they did: no retries);
3. the jobs that arrive now are submitted, each with the requests it was submitted with and
   its dependencies on the replay's own jobs (a job the cluster refuses, none of its nodes
   could run it, is noted with why, and so are the jobs that depend on it);
4. `claim_latency` after an end or an arrival, while jobs are pending, the nodes where jobs
   ended or were placed poll, then, when that may start more (`_poll_rounds`), every node
   with CPUs free in id order, and again those whose poll started something, until none
   does; a node claims each job its poll hands out that fits in what it has free (the
   scheduler does the fitting: a job that does not is counted in `overfilled`, which stays
   0), and the job ends its past run time later.

A node with fewer CPUs free than every pending job needs, a poll while nothing is pending,
or a poll of a node nothing changed for since its last would get nothing: they are skipped,
which makes a week of jobs a few polls per job. (Not quite nothing: an end also moves
fair-share usage, which may reorder another node's queue; that node sees the new order at
its next poll.) The store keeps nothing (`_Forgetful`) and is written without turns
(`_NoTurns`): a replay never restarts, and nobody reads its jobs back from disk.

Every decision is the service's: placement at submission, the poll's order (priority, fair
share, age), fit and backfill (`fit.Picker`), queue and user limits, dependencies and the idle
node's take-over of waiting work. This module decides only when things happen.

Tests: `tests/test_simulate.py` and `tests/test_simulate_cluster.py` (against real agents).
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import heapq
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .. import errors
from ..clock import ManualClock
from ..cluster.node_book import BuiltinNodes, Drains, NodeBook
from ..cluster.node_requests import Heartbeat
from ..config import BUILTIN_REGISTRY, LEAST_LOADED, Settings
from ..domain import fit, jobs, validation
from ..domain.jobs import Job
from ..domain.placement import Placement
from ..domain.queues import QueueSettings
from ..domain.users import UserSettings
from ..domain.validation import JobUpdate
from ..service import Scheduler
from ..state.schedule_table import ScheduleTable
from ..state.table import JobTable
from ..storage import Batch, JobStore, OutboxEvent, Writer
from ..storage.memory import MemoryDatabase, MemoryStore
from .history import Node, PastJob

US = 1_000_000

REPLAY_HEARTBEAT_SECS = 3600.0
REPLAY_LOST_SECS = 10 * 365 * 86400.0

NO_MEMORY_LIMIT = 1 << 40
"""MiB free on a node that reports none: the scheduler checks no job's memory there."""


@dataclasses.dataclass(frozen=True)
class Setup:
    """What a replay runs on: the nodes, the placement, the limits (queue or user name to
    `max_running`) and the time from an event to the polls it sets off (microseconds)."""

    nodes: Sequence[Node]
    placement: str = LEAST_LOADED
    queue_limits: Mapping[str, int] = dataclasses.field(default_factory=dict)
    user_limits: Mapping[str, int] = dataclasses.field(default_factory=dict)
    claim_latency_us: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class Run:
    """Where and when (microseconds since the epoch) a job ran in the replay."""

    node_id: str
    start: int
    end: int


@dataclasses.dataclass
class Outcome:
    """What a replay found: each past job's run (by its seq in the history), the jobs that
    could not run and why, and how often a poll handed a node more than it had free."""

    runs: dict[int, Run]
    refused: dict[int, str]
    overfilled: int = 0


class _Shapes:
    """Jobs not started yet, counted by what decides where they could start (what they
    need, their `node_selector` and `node_ids`), with one job of each shape to ask
    `fit.could_run` with: a queue's backlog is hundreds of jobs of a few shapes."""

    def __init__(self) -> None:
        self._count: collections.Counter[fit.Shape] = collections.Counter()
        self._example: dict[fit.Shape, Job] = {}

    def add(self, job: Job) -> None:
        shape = fit.shape_of(job)
        self._count[shape] += 1
        self._example.setdefault(shape, job)

    def remove(self, job: Job) -> None:
        shape = fit.shape_of(job)
        self._count[shape] -= 1
        if not self._count[shape]:
            del self._count[shape], self._example[shape]

    def examples(self) -> list[Job]:
        return list(self._example.values())


class _Forgetful(MemoryStore):
    """A store that commits into thin air: a `MemoryStore` would keep every batch and check
    each one against every job it holds, which a week of jobs makes quadratic."""

    def write(self, batch: Batch) -> None:
        pass


class _NoTurns(Writer):
    """The writer of a replay: one thread, and a store that keeps nothing, so a commit has no
    turn to take (the daemon's writer queues each change, makes its waiter and hands the turn
    on: a tenth of a replay's time) and nothing rides with a later one."""

    def _submit(self, batch: Batch, read: Callable[[JobStore], Any] | None = None) -> Any:
        return read(self._backend) if read is not None else None

    def save(self, *changed: Job, events: Sequence[OutboxEvent] = ()) -> None:
        pass  # the one every change makes: not even its batch is needed

    def save_soon(self, batch: Batch) -> None:
        pass


class VirtualCluster:
    """One scheduler in memory at `start_us`, its nodes the agents of `setup` (heartbeats it
    is told of); `settings` are Settings fields."""

    def __init__(self, setup: Setup, start_us: int, **settings: Any) -> None:
        self.clock = ManualClock(start_us)
        self.nodes = list(setup.nodes)
        fields: dict[str, Any] = {
            "registry_url": BUILTIN_REGISTRY,
            "max_jobs_per_node": "auto",
            "placement": setup.placement,
            "max_job_retries": 0,  # a past failure is replayed as one: its retries are past too
            # Nodes never fail in a replay: a heartbeat an hour keeps them healthy, and costs
            # a week of jobs a few beats per node, not one at every event.
            "node_heartbeat_secs": REPLAY_HEARTBEAT_SECS,
            "node_lost_secs": REPLAY_LOST_SECS,
        }
        self.settings = Settings(**{**fields, **settings})
        # A replay starts empty: no jobs, schedules or nodes to load.
        table = JobTable(half_life_secs=self.settings.fairshare_half_life_secs)
        book = NodeBook(self.clock, self.settings.node_heartbeat_secs, self.settings.node_lost_secs)
        placement = Placement(Drains(BuiltinNodes(book), book), self.settings, table, self.clock)
        self.service = Scheduler(
            self.settings,
            _NoTurns(_Forgetful(MemoryDatabase())),
            table,
            placement,
            ScheduleTable(),
            clock=self.clock,
            book=book,
        )
        # Nobody listens to a replay's changes: no agent waits in a heartbeat (each poll is
        # the replay's own), nobody follows output or the event stream. Waking them (a node's
        # load read at every change) was a tenth of a replay's time.
        self.service.listeners.clear()
        for name, limit in sorted(setup.queue_limits.items()):
            self.service.queues.update(QueueSettings(name, limit))
        for name, limit in sorted(setup.user_limits.items()):
            self.service.users.update(UserSettings(name, limit))

    def heartbeat(self, node: Node, running: Sequence[str]) -> None:
        beat = Heartbeat(
            node.cpus,
            frozenset(running),
            "simulate",
            tuple(sorted(node.labels.items())),
            memory_mb=node.memory_mb or None,
            gpus=node.gpus,
        )
        self.service.nodes.heartbeat(node.node_id, beat)

    def submit(self, body: dict[str, Any], owner: str = "") -> Job:
        request = validation.job_request_from(body)  # checked as a POST's decoded body is
        job, _ = self.service.jobs.submit(request, owner=owner)
        return job

    def poll(self, node_id: str) -> list[Job]:
        return self.service.dispatch.poll(node_id)

    def claim(self, job: Job, node_id: str) -> Job:
        update = JobUpdate(status=jobs.RUNNING, node_id=node_id, attempt=job.retry_count)
        return self.service.jobs.update(job.job_id, update)

    def report(self, job: Job, node_id: str, failed: bool = False) -> Job:
        status, code = (jobs.FAILED, 1) if failed else (jobs.DONE, 0)
        update = JobUpdate(status=status, exit_code=code, node_id=node_id, attempt=job.retry_count)
        return self.service.jobs.update(job.job_id, update)


def capacity_of(node: Node) -> fit.Resources:
    return fit.Resources(node.cpus, node.memory_mb or NO_MEMORY_LIMIT, node.gpus)


def replay(past: Sequence[PastJob], setup: Setup, **settings: Any) -> Outcome:
    """Run the past jobs (in arrival order) again on a new virtual cluster (see the module's
    notes); `settings` are Settings fields."""
    start = past[0].arrival if past else 0
    # A replay makes millions of short-lived objects beside the week it keeps: collecting
    # less often (young objects 20,000 at a time, not 700) spares rescanning what it keeps.
    thresholds = gc.get_threshold()
    gc.set_threshold(20_000, 50, 100)
    try:
        return _Replay(VirtualCluster(setup, start, **settings), past, setup).run()
    finally:
        gc.set_threshold(*thresholds)


class _Replay:
    """One replay's state: what waits to arrive, what runs where, what each node has free."""

    def __init__(self, cluster: VirtualCluster, past: Sequence[PastJob], setup: Setup) -> None:
        self.cluster = cluster
        self.past = past
        self.latency = setup.claim_latency_us
        self.limited = (set(setup.queue_limits), set(setup.user_limits))
        self.heartbeat_us = int(cluster.settings.node_heartbeat_secs * US)
        self.outcome = Outcome({}, {})
        self.by_job_id: dict[str, PastJob] = {}  # the replay's job id -> the past job
        self.replayed: dict[int, int] = {}  # past seq -> the replay's seq
        self.ends: list[tuple[int, int, Job, str]] = []  # (end, seq, job, node id): a heap
        self.polls: list[int] = []  # times the free nodes poll at: a heap
        self.running: dict[str, set[str]] = {node.node_id: set() for node in cluster.nodes}
        self.free = {node.node_id: capacity_of(node) for node in cluster.nodes}
        self.beaten: dict[str, int] = {}  # node id -> the time of its last heartbeat
        self.next_beat = 0  # no node beats before then
        self.pending = 0  # jobs submitted and not started
        self.needs: collections.Counter[int] = collections.Counter()  # their CPUs, counted
        self.touched: dict[str, None] = {}  # nodes to poll first: jobs ended or placed there
        self.arrived: dict[str, Job] = {}  # jobs submitted since the last polls, not started
        self.capacities = {
            node.node_id: fit.Capacity(node.node_id, capacity_of(node), dict(node.labels))
            for node in cluster.nodes
        }
        # Ends since the last polls that made room in a limit (its group, below) or met a
        # dependency (the past seqs of the jobs that waited for it).
        self.opened: set[tuple[str, str]] = set()
        self.released: list[int] = []
        self.dependents: dict[int, list[int]] = collections.defaultdict(list)
        for job in past:
            for dep in job.depends_on:
                self.dependents[dep].append(job.seq)
        self.unstarted: dict[int, Job] = {}  # past seq -> its job, submitted and not started
        self.shapes: dict[tuple[str, str], _Shapes] = collections.defaultdict(_Shapes)

    def run(self) -> Outcome:
        clock = self.cluster.clock
        past, arrived = self.past, 0
        while arrived < len(past) or self.ends or self.polls:
            ahead = [past[arrived].arrival] if arrived < len(past) else []
            if self.ends:
                ahead.append(self.ends[0][0])
            if self.polls:
                ahead.append(self.polls[0])
            clock.set_us(max(clock.now_us(), min(ahead)))
            now = clock.now_us()
            self._heartbeats(now)
            changed = self._report_ends(now)
            while arrived < len(past) and past[arrived].arrival <= now:
                self._submit(past[arrived])
                arrived += 1
                changed = True
            if changed and (not self.polls or self.polls[-1] != now + self.latency):
                heapq.heappush(self.polls, now + self.latency)
            if self.polls and self.polls[0] <= now:
                while self.polls and self.polls[0] <= now:
                    heapq.heappop(self.polls)
                if self.pending:
                    self._poll_rounds(now)
                self.touched.clear()
                self.arrived.clear()
                self.opened.clear()
                self.released.clear()
        return self.outcome

    def _heartbeats(self, now: int) -> None:
        if now < self.next_beat:
            return
        self.next_beat = now + self.heartbeat_us
        for node in self.cluster.nodes:
            if now - self.beaten.get(node.node_id, -self.heartbeat_us) >= self.heartbeat_us:
                self.cluster.heartbeat(node, sorted(self.running[node.node_id]))
                self.beaten[node.node_id] = now

    def _report_ends(self, now: int) -> bool:
        ended = False
        while self.ends and self.ends[0][0] <= now:
            _, _, job, node_id = heapq.heappop(self.ends)
            self.cluster.report(job, node_id, self.by_job_id[job.job_id].failed)
            self.free[node_id] += fit.need_of(job)
            self.running[node_id].discard(job.job_id)
            self.touched[node_id] = None
            past = self.by_job_id[job.job_id]
            self.opened.update(self._limits_of(past))
            self.released.extend(self.dependents.get(past.seq, ()))
            ended = True
        return ended

    def _limits_of(self, job: PastJob) -> list[tuple[str, str]]:
        """The limited groups the job counts in: its queue's, its owner's."""
        queues, users = self.limited
        found = [("queue", job.queue)] if job.queue in queues else []
        return [*found, ("owner", job.owner)] if job.owner in users else found

    def _submit(self, job: PastJob) -> None:
        missing = [dep for dep in job.depends_on if dep not in self.replayed]
        if missing:
            lost = jobs.job_id_of(missing[0])
            self.outcome.refused[job.seq] = f"depends on {lost}, which could not run"
            return
        body = job.request([self.replayed[dep] for dep in job.depends_on])
        try:
            made = self.cluster.submit(body, job.owner)
        except errors.BadRequest as exc:
            self.outcome.refused[job.seq] = str(exc)
            return
        self.replayed[job.seq] = made.seq
        self.by_job_id[made.job_id] = job
        self.pending += 1
        self.needs[fit.need_of(made).cpus] += 1
        self.touched[made.node_id] = None
        self.arrived[made.job_id] = made
        self.unstarted[job.seq] = made
        for group in self._limits_of(job):
            self.shapes[group].add(made)

    def _poll_rounds(self, now: int) -> None:
        """The touched nodes poll; then the other nodes whose answer may have changed: those
        where a job that may newly start could start now (`fit.could_run`, in what the node
        has free), which may take it over. Such a job arrived and is still pending (its own
        node is full), or waited for a dependency an end met, or is of a queue or user whose
        limit an end made room in (any such job still pending, by its shape). For any other
        node nothing changed since its last poll (what it has free, and the jobs it could
        take), so that answer stands; nor does a plain end change anything for the other
        nodes."""
        self._rounds([node_id for node_id in self.touched if node_id in self.free], now)
        if not self.pending:
            return
        maybe = [*self.arrived.values()]
        maybe += [self.unstarted[seq] for seq in self.released if seq in self.unstarted]
        for group in self.opened:
            maybe += self.shapes[group].examples()
        if not maybe:
            return
        newly = [(job, fit.need_of(job)) for job in maybe]
        self._rounds(
            [
                node.node_id
                for node in self.cluster.nodes
                if any(
                    self.free[node.node_id].covers(need)
                    and fit.could_run(job, self.capacities[node.node_id])
                    for job, need in newly
                )
            ],
            now,
        )

    def _rounds(self, order: list[str], now: int) -> None:
        while order and self.pending:
            # Again only where a poll started something: starting frees nothing elsewhere. A
            # node with fewer CPUs free than every pending job needs would get nothing.
            order = [
                node_id
                for node_id in order
                if self.pending
                and self.free[node_id].cpus >= min(self.needs)
                and self._poll(node_id, now)
            ]

    def _poll(self, node_id: str, now: int) -> bool:
        started = False
        for job in self.cluster.poll(node_id):
            need = fit.need_of(job)
            if not self.free[node_id].covers(need):
                self.outcome.overfilled += 1  # left pending, as a real agent would
                continue
            claimed = self.cluster.claim(job, node_id)
            self.free[node_id] -= need
            self.running[node_id].add(job.job_id)
            past = self.by_job_id[job.job_id]
            end = now + past.run_us
            heapq.heappush(self.ends, (end, claimed.seq, claimed, node_id))
            self.outcome.runs[past.seq] = Run(node_id, now, end)
            self.pending -= 1
            self.needs[need.cpus] -= 1
            if not self.needs[need.cpus]:
                del self.needs[need.cpus]
            self.arrived.pop(job.job_id, None)
            del self.unstarted[past.seq]
            for group in self._limits_of(past):
                self.shapes[group].remove(job)
            started = True
        return started
