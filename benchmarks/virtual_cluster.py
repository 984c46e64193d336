"""A simulated cluster on a virtual clock: the real service (placement, the job table, the
poll with its backfill, moving waiting work) on a `MemoryStore`, with a `ManualClock`, its
nodes the agents that heartbeat (`REGISTRY_URL=builtin`, so a node's CPUs are its
`cpu_count`), and a trace replayed on it event by event: no port, no thread, no sleep, the
same answer every time. The shape of `tests/harness.py`, built again here (the benchmarks do
not import the tests).

`replay` moves the clock to the next event (a burst of submissions, or the end of a running
job), reports the jobs that end then, lets every node heartbeat (listing what it runs),
submits the jobs due then, and polls the nodes in id order, again until a round of polls starts
nothing; each node claims every job its poll hands out (checking that it fits in what the
node has free: the scheduler does the fitting), and a claimed job ends at its start plus its
run time.

For the length of a replay the table's picker (`fit.Picker`, which the table builds for each
poll) is swapped for a subclass: with `strict`, one that never lets a job pass the first that
does not fit (strict priority-then-age order, `StrictPicker`); else the real one, noting each
job it finds blocked at the head (those backfill may pass).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import orjson

from tiny_scheduler.clock import ManualClock
from tiny_scheduler.cluster.node_book import BuiltinNodes, Drains, NodeBook
from tiny_scheduler.cluster.node_requests import Heartbeat
from tiny_scheduler.config import BUILTIN_REGISTRY, Settings
from tiny_scheduler.domain import fit, jobs, validation
from tiny_scheduler.domain.jobs import Job
from tiny_scheduler.domain.placement import Placement
from tiny_scheduler.domain.validation import JobUpdate
from tiny_scheduler.service import Scheduler
from tiny_scheduler.state import table as table_module
from tiny_scheduler.state.schedule_table import ScheduleTable
from tiny_scheduler.state.table import JobTable
from tiny_scheduler.storage import Writer
from tiny_scheduler.storage.memory import MemoryDatabase, MemoryStore

from .fit_trace import NodeSpec, TraceJob

T0 = 1_800_000_000_000_000
"""The virtual clock's start (microseconds since the epoch)."""

US = 1_000_000


class VirtualCluster:
    """One scheduler in memory, its nodes the agents of `nodes` (heartbeats it is told of)."""

    def __init__(self, nodes: Sequence[NodeSpec], **settings: Any) -> None:
        self.clock = ManualClock(T0)
        self.nodes = list(nodes)
        self.settings = Settings(
            registry_url=BUILTIN_REGISTRY, max_jobs_per_node="auto", **settings
        )
        writer = Writer(MemoryStore(MemoryDatabase()))
        loaded = writer.load()
        table = JobTable(
            loaded.jobs,
            loaded.last_seq,
            loaded.queues,
            loaded.users,
            self.settings.fairshare_half_life_secs,
        )
        book = NodeBook(self.clock, self.settings.node_heartbeat_secs, self.settings.node_lost_secs)
        placement = Placement(Drains(BuiltinNodes(book), book), self.settings, table, self.clock)
        self.service = Scheduler(
            self.settings,
            writer,
            table,
            placement,
            ScheduleTable(loaded.schedules, loaded.last_schedule_seq),
            clock=self.clock,
            book=book,
            nodes=loaded.nodes,
        )

    def heartbeat(self, node: NodeSpec, running: Sequence[str]) -> None:
        beat = Heartbeat(
            node.cpus,
            frozenset(running),
            "bench",
            tuple(sorted(node.labels.items())),
            memory_mb=node.cpus * 2048,
            gpus=0,
        )
        self.service.nodes.heartbeat(node.node_id, beat)

    def submit(self, body: dict[str, Any]) -> Job:
        request = validation.parse_job_request(orjson.dumps(body))
        job, _ = self.service.jobs.submit(request)
        return job

    def poll(self, node_id: str) -> list[Job]:
        return self.service.dispatch.poll(node_id, from_agent=True)

    def claim(self, job: Job, node_id: str) -> Job:
        update = JobUpdate(status=jobs.RUNNING, node_id=node_id, attempt=job.retry_count)
        return self.service.jobs.update(job.job_id, update)

    def report(self, job: Job, node_id: str) -> Job:
        update = JobUpdate(status=jobs.DONE, exit_code=0, node_id=node_id, attempt=job.retry_count)
        return self.service.jobs.update(job.job_id, update)


@dataclasses.dataclass(frozen=True)
class Started:
    """Where and when (seconds after the first submission) a job of the trace ran."""

    node_id: str
    start: float
    end: float


@dataclasses.dataclass
class Replay:
    """What a replay found: each job's run (by its place in the trace), the jobs that were
    ever the blocked head of a node's order, and how often a poll handed a node more than
    it had free (never, if the scheduler fits)."""

    runs: dict[int, Started]
    heads: set[int]
    overfilled: int = 0

    @property
    def makespan(self) -> float:
        return max(run.end for run in self.runs.values())


def replay(
    trace: Sequence[TraceJob], nodes: Sequence[NodeSpec], strict: bool = False, **settings: Any
) -> Replay:
    """Run the whole trace on a new virtual cluster (see the module's notes); `settings` are
    Settings fields (placement="binpack", ...)."""
    heads: set[str] = set()
    with _picking_with(StrictPicker if strict else _recording(heads)):
        found, by_id = _replay(VirtualCluster(nodes, **settings), trace)
    found.heads = {by_id[job_id].n for job_id in heads}
    return found


def _replay(
    cluster: VirtualCluster, trace: Sequence[TraceJob]
) -> tuple[Replay, dict[str, TraceJob]]:
    nodes = cluster.nodes
    clock = cluster.clock
    heartbeat_us = int(cluster.settings.node_heartbeat_secs * US)
    waiting = sorted(trace, key=lambda job: (job.at, job.n))
    by_id: dict[str, TraceJob] = {}
    running: dict[str, tuple[int, Job, str]] = {}  # job id -> (end, the job, its node)
    free = {node.node_id: node.cpus for node in nodes}
    found = Replay({}, set())
    while waiting or running:
        ahead = [T0 + round(waiting[0].at * US)] if waiting else []
        ahead += [end for end, _, _ in running.values()]
        # Never longer than a heartbeat period between two steps: the nodes stay healthy.
        clock.set_us(max(clock.now_us(), min(min(ahead), clock.now_us() + heartbeat_us)))
        now = clock.now_us()
        for job_id, (end, job, node_id) in sorted(running.items(), key=lambda item: item[1][0]):
            if end <= now:
                cluster.report(job, node_id)
                free[node_id] += fit.need_of(job).cpus
                del running[job_id]
        for node in nodes:
            on_node = [job_id for job_id, (_, _, where) in running.items() if where == node.node_id]
            cluster.heartbeat(node, on_node)
        while waiting and T0 + round(waiting[0].at * US) <= now:
            made = cluster.submit(waiting[0].body())
            by_id[made.job_id] = waiting.pop(0)
        started = True
        while started:
            started = False
            for node in nodes:
                for job in cluster.poll(node.node_id):
                    need = fit.need_of(job).cpus
                    if need > free[node.node_id]:
                        found.overfilled += 1  # left pending, as a real agent would
                        continue
                    claimed = cluster.claim(job, node.node_id)
                    free[node.node_id] -= need
                    spec = by_id[job.job_id]
                    running[job.job_id] = (now + round(spec.secs * US), claimed, node.node_id)
                    found.runs[spec.n] = Started(
                        node.node_id, (now - T0) / US, (now - T0) / US + spec.secs
                    )
                    started = True
    return found, by_id


# --- the pickers ------------------------------------------------------------------------------


class StrictPicker(fit.Picker):
    """Strict priority-then-age order: no job starts ahead of the first that does not fit."""

    def offer(self, job: Job) -> bool:
        if self.head is not None:
            return False
        return super().offer(job)

    @property
    def exhausted(self) -> bool:
        return self.head is not None or super().exhausted


def _recording(heads: set[str]) -> type[fit.Picker]:
    class RecordingPicker(fit.Picker):
        """The real picker, noting in `heads` each job it finds blocked at the head."""

        def offer(self, job: Job) -> bool:
            taken = super().offer(job)
            if self.head is not None:
                heads.add(self.head.job_id)
            return taken

    return RecordingPicker


@contextlib.contextmanager
def _picking_with(picker: type[fit.Picker]) -> Iterator[None]:
    """The job table builds its pickers from `picker` meanwhile."""
    saved = table_module.Picker
    table_module.Picker = picker  # type: ignore[misc]
    try:
        yield
    finally:
        table_module.Picker = saved  # type: ignore[misc]
