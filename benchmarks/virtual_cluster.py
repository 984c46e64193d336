"""The fit scenario's trace on a virtual clock: the product's replay (`tiny_scheduler.simulate`,
the real service in memory on a `ManualClock`, nodes that heartbeat, events in time order)
run on `fit_trace`'s jobs and nodes, with the answers the fit report reads.

`replay` turns the trace into past jobs (each node's memory 2 GiB per CPU, as the fit agents
report) and replays it with no claim latency. For its length the table's picker (`fit.Picker`,
which the table builds for each poll) is swapped for a subclass: with `strict`, one that never
lets a job pass the first that does not fit (strict priority-then-age order, `StrictPicker`);
else the real one, noting each job it finds blocked at the head (those backfill may pass).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

from tiny_scheduler.config import LEAST_LOADED
from tiny_scheduler.domain import fit
from tiny_scheduler.domain.jobs import DEFAULT_PRIORITY, Job
from tiny_scheduler.simulate import replay as simulate
from tiny_scheduler.simulate.history import Node, PastJob
from tiny_scheduler.state import table as table_module

from .fit_trace import NodeSpec, TraceJob

T0 = 1_800_000_000_000_000
"""The virtual clock's start (microseconds since the epoch)."""

US = 1_000_000


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
    """Run the whole trace on a new virtual cluster; `settings` are Settings fields
    (placement="binpack", ...)."""
    past = [_past(job) for job in sorted(trace, key=lambda job: (job.at, job.n))]
    cluster_nodes = [Node(n.node_id, n.cpus, n.cpus * 2048, 0, dict(n.labels)) for n in nodes]
    placement = settings.pop("placement", LEAST_LOADED)
    setup = simulate.Setup(cluster_nodes, placement)
    heads: set[str] = set()
    with _picking_with(StrictPicker if strict else _recording(heads)):
        outcome = simulate.replay(past, setup, **settings)
    runs = {
        seq - 1: Started(run.node_id, (run.start - T0) / US, (run.end - T0) / US)
        for seq, run in outcome.runs.items()
    }
    # The replay's jobs are made in arrival order: job-N is the Nth past job.
    made = {f"job-{number}": job.seq - 1 for number, job in enumerate(past, 1)}
    return Replay(runs, {made[job_id] for job_id in heads}, outcome.overfilled)


def _past(job: TraceJob) -> PastJob:
    at = T0 + round(job.at * US)
    return PastJob(
        seq=job.n + 1,
        arrival=at,
        start=at,
        end=at + round(job.secs * US),
        node_id="",
        cpus=job.cpus,
        node_selector=dict(job.selector) if job.selector else None,
        priority=job.priority or DEFAULT_PRIORITY,
        timeout_secs=job.timeout_secs,
    )


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
