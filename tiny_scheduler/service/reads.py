"""Reads of jobs, nodes and the store's state, what the API, the dashboard, the metrics and the
loops look at; and the outbox of final-state events, which the SNS loop empties.

Output lives in the store, not in the table: the reads that show it (`get`, `with_output`)
fetch it from disk after the table was asked, never holding the table's lock, and the agent's
poll (pending jobs, which show none) never touches the disk.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence

from .. import errors
from ..domain import fit, jobs
from ..domain.jobs import Job, Output
from ..domain.nodes import Nodes
from ..domain.placement import NodeLoad
from ..domain.validation import MAX_ARRAY, JobQuery
from ..state.table import NodeJobs
from ..storage import OutboxEvent
from ..storage.writer import CommitObserver
from . import dependencies, why_waiting
from .core import Core, job_seq


@dataclasses.dataclass(frozen=True, slots=True)
class Page:
    jobs: list[Job]  # without their output: `Reads.with_output` reads it
    next_after: int | None  # seq to continue after, when more jobs match


class Reads:
    """Looking at jobs, nodes and the store."""

    def __init__(self, core: Core) -> None:
        self._core = core

    def get(self, job_id: str) -> Job:
        """One job with its output and its earlier attempts' (read from the store)."""
        job = self._core.table.get(job_seq(job_id))
        if job is None:
            raise errors.NotFound(errors.JOB_NOT_FOUND)
        return self._core.with_stored_output(job)

    def find(self, job_id: str) -> Job:
        """One job as the table holds it, without output (memory only: the access checks
        read who owns a job and where it ran); NotFound for an unknown id."""
        job = self._core.table.get(job_seq(job_id))
        if job is None:
            raise errors.NotFound(errors.JOB_NOT_FOUND)
        return job

    def list_jobs(
        self,
        query: JobQuery,
        *,
        newest: bool = False,
        before: int | None = None,
        also: Callable[[Job], bool] | None = None,
    ) -> Page:
        """Jobs matching the query, oldest first (the agent's own query is `poll`), without
        their output. The dashboard's own: `newest` first, below `before`, and `also` (a
        search, one row per array) on top of the query's filters."""
        exact = {"name": query.name, "owner": query.owner}
        found, more = self._core.table.query(
            query.node_id,
            query.status,
            query.job_type,
            query.after,
            query.limit,
            query.reason,
            query.queue,
            exact={name: value for name, value in exact.items() if value is not None},
            array_id=query.array_id,
            also=also,
            newest=newest,
            before=before,
            finished=(query.finished_since, query.finished_until),
        )
        return Page(found, found[-1].seq if more and found else None)

    def array_jobs(self, array_id: int, limit: int = MAX_ARRAY) -> list[Job]:
        """The jobs of the array whose first job is `array_id`, by index, at most `limit`
        (one seek and a walk over its consecutive ids)."""
        found, _ = self._core.table.query(None, None, None, 0, limit, array_id=array_id)
        return found

    def array_counts(self, array_id: int) -> dict[str, int]:
        """How many of an array's jobs are in each state people read (O(1): kept by the
        table at each change)."""
        return self._core.table.array_counts(array_id)

    def waiting_for(self, job: Job) -> str | None:
        """Why a pending job waits (`why_waiting`), from the table as it stands; None for a
        job that is not pending."""
        return self.waiting_for_each([job]).get(job.seq)

    def waiting_for_each(self, found: Sequence[Job]) -> dict[int, str]:
        """Why each pending job of `found` waits, by seq (a listing's page): each node's load
        and each queue's state read once for the page."""
        waiting = [job for job in found if job.status == jobs.PENDING]
        if not waiting:
            return {}
        core = self._core
        table = core.table
        queue_names = {job.queue for job in waiting}
        with table.queue_limits() as limits:
            states = {name: limits.state(name) for name in queue_names}
        with table.user_limits() as (user_limits, _):
            owners = {job.owner: user_limits.state(job.owner) for job in waiting}
        placement = core.placement
        nodes = placement.source.cached_nodes()
        node_ids = sorted({job.node_id for job in waiting})
        loads = {load.node_id: load for load in placement.loads(node_ids, nodes)}
        capacities = {node: placement.capacity(node, nodes) for node in node_ids}
        now = core.now()
        # Backfill is asked only about nodes where a waiting job fits what is free now (only
        # there can it be what holds a job back): one picker's walk per such node.
        held_back = {
            node_id: table.held_back(capacities[node_id], now, core.expected_end)
            for node_id in {
                job.node_id
                for job in waiting
                if loads[job.node_id].available.covers(fit.need_of(job))
            }
        }
        why: dict[int, str] = {}
        for job in waiting:
            unmet = dependencies.unmet(job, {seq: table.get(seq) for seq in job.depends_on})
            settings, running = states[job.queue]
            user, user_running = owners[job.owner]
            text = why_waiting.waiting_for(
                job,
                unmet,
                settings,
                running,
                capacities[job.node_id],
                loads[job.node_id].available,
                now,
                user,
                user_running,
                held_back.get(job.node_id, fit.NOT_HELD),
            )
            if text is not None:
                why[job.seq] = text
        return why

    def with_output(self, found: Sequence[Job]) -> Iterator[Job]:
        """The jobs of a page, in order, each with its latest output, read from the store one
        job at a time as the caller goes: a page of big outputs is never in memory at once.
        A job that retention removed since the page was taken is left out."""
        stored = self._core.store.read_latest_outputs([job.seq for job in found if job.is_final])
        held: tuple[int, Output | None] | None = None  # read, for a job further on
        with contextlib.closing(stored):
            for job in found:
                if not job.is_final:
                    yield job  # only a finished attempt has output
                    continue
                if held is None:
                    held = next(stored, None)
                if held is None or held[0] != job.seq:
                    continue  # gone from the store: removed by retention meanwhile
                output, held = held[1], None
                yield job.with_output({job.retry_count: output}) if output else job

    def counts(self) -> dict[str, int]:
        """Number of jobs in each status."""
        return self._core.table.counts()

    def reason_counts(self) -> dict[str, int]:
        """Number of jobs failed for good by each reason."""
        return self._core.table.reason_counts()

    def running(self) -> list[Job]:
        """Every running job (O(running), not O(history))."""
        return self._core.table.running()

    def busy_nodes(self) -> set[str]:
        """Nodes that have pending or running jobs, or a timed-out job keeping a slot."""
        return self._core.table.busy_nodes()

    def jobs_on(self, node_id: str) -> NodeJobs:
        """The node's pending, running and slot-holding timed-out jobs, oldest first."""
        return self._core.table.on_node(node_id)

    def queue_depths(self) -> dict[str, int]:
        """Due pending jobs of every node that has any."""
        return self._core.table.queue_depths()

    def recent_jobs(self, since_us: int) -> list[Job]:
        """Every job that is pending or running, or finished at or after `since_us`, oldest
        first: what the dashboard's last-hour chart counts. O(recent jobs), not O(history)."""
        return self._core.table.recent(since_us)

    # --- nodes ---------------------------------------------------------------------------

    def node_health(self) -> Nodes:
        """The compute nodes and their health; PlacementError when the source cannot say."""
        return self._core.placement.source.nodes()

    def node_loads(self, node_ids: list[str], nodes: Nodes | None) -> list[NodeLoad]:
        """Slots, waiting `run` jobs and slots in use of each node (O(nodes)); slots from
        `nodes` when MAX_JOBS_PER_NODE is `auto`."""
        return self._core.placement.loads(node_ids, nodes)

    def cached_nodes(self) -> Nodes | None:
        """The node list as last fetched, however old; never waits on a peer."""
        return self._core.placement.source.cached_nodes()

    def next_node(self) -> str:
        """The node the next submission would go to; a pure read (the rotation stays)."""
        return self._core.placement.peek()

    # --- the store -----------------------------------------------------------------------

    def store_health(self) -> tuple[bool, str | None]:
        """Whether the store can be written (its latest write or probe, at most a few seconds
        old, succeeded), and the error when it cannot."""
        return self._core.store.health()

    def watch_commits(self, observer: CommitObserver) -> None:
        """Have `observer` told the duration and size of every group commit."""
        self._core.store.commit_observers.append(observer)

    def keep_final_events(self, message: Callable[[Job], str]) -> None:
        """From now on, store `message(job)` in the outbox with every change that makes a job
        final, in the same transaction: the event is durable exactly when the change is."""
        self._core.final_event = message

    def waiting_events(self, limit: int) -> list[OutboxEvent]:
        """The oldest events not yet delivered (at most `limit`), oldest first; StoreError
        when the store cannot be read."""
        return self._core.store.outbox(limit)

    def events_delivered(self, ids: Iterable[int]) -> None:
        """Remove delivered events from the outbox; StoreError when that cannot be stored."""
        self._core.store.delivered(ids)

    def events_waiting(self) -> int:
        """How many events the outbox holds (no I/O)."""
        return self._core.store.events_waiting
