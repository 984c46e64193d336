"""What every part of the service shares, and the one place a change is committed.

A `Core` holds the collaborators (settings, clock, store, placement) and the current term's
tables (a new leader's term replaces them). Its `commit` is the only way a job's next version
becomes durable and visible: saved with its outbox event (the SNS message of a final state,
in the same transaction), then put in the table, then announced to listeners. The parts of
the service decide what the next version is; they hand it here.

A job that ends `failed` for good takes its `ok` dependents with it (`dependencies.cascade`
decides which): the commit holds them busy, and saves them, each with its own outbox event,
in the same transaction as the failure that caused them, so no reader, restart or failover
ever sees the one without the others.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from enum import Enum

from .. import errors
from ..clock import Clock
from ..config import Settings
from ..domain import jobs, schedules
from ..domain.jobs import Job
from ..domain.placement import Placement
from ..state.audit_log import AuditLog
from ..state.schedule_table import ScheduleTable
from ..state.table import JobTable
from ..state.token_book import TokenBook
from ..storage import OutboxEvent, Writer
from . import dependencies

log = logging.getLogger("tiny_scheduler.service")


class Event(str, Enum):
    """What a committed change did, as told to listeners."""

    __str__ = str.__str__

    SUBMITTED = "submitted"  # detail: the source (http, sqs, schedule)
    STARTED = "started"
    FINISHED = "finished"  # a final status
    RETRIED = "retried"
    MOVED = "moved"  # detail: why (Move)
    HELD = "held"  # a person held a pending job
    RELEASED = "released"  # and released it
    POLLED = "polled"  # job None, detail: the node


class Move(str, Enum):
    """Why a waiting job went to another node (the detail of a `moved` event)."""

    __str__ = str.__str__

    STOLEN = "stolen"  # taken by an idle node's poll from a node that could not start it
    NODE_DOWN = "node_down"  # re-placed by the scan: its node is unhealthy or gone


Listener = Callable[[Event, "Job | None", str], None]
"""Called after a committed change as listener(event, job, detail)."""


class Core:
    """The shared state of one scheduler and the committer of its changes."""

    def __init__(
        self,
        settings: Settings,
        clock: Clock,
        store: Writer,
        table: JobTable,
        placement: Placement,
        schedule_table: ScheduleTable,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.store = store
        self.table = table  # replaced at each term's start (PostgreSQL)
        self.placement = placement
        self.schedules = schedule_table
        self.tokens = TokenBook()  # replaced at each term's start, like the tables
        self.audit = AuditLog()
        self.listeners: list[Listener] = []
        self.final_event: Callable[[Job], str] | None = None  # see keep_final_events
        # Held while a failure's dependents are read and committed, and while a job with
        # dependencies is checked and created: a new dependent of a job that is failing right
        # now is either in the failure's cascade or sees the failure (and ends at once).
        # Reentrant: a job created failed commits through the failure path.
        self.dependency_lock = threading.RLock()

    def now(self) -> int:
        return self.clock.now_us()

    def expected_end(self, job: Job, start: int) -> int | None:
        """When a job started at `start` ends by its timeout (backfill's expectation; None
        for a service, which never ends by itself)."""
        return jobs.deadline_from(job, start, self.settings.job_timeout_secs)

    # --- committing ----------------------------------------------------------------------

    def commit(self, job: Job, becomes_final: bool = True) -> list[Job]:
        """Save and show the job's next version (the caller holds it busy). `becomes_final`
        is False for a change to a job that was final already (a timed-out job's slot freed):
        its event went out with the change that made it final. Returns the dependents that
        ended with it (a failure's cascade), already announced."""
        if not (becomes_final and job.status == jobs.FAILED):
            self._save(job, (), becomes_final)
            return []
        ended = self._commit_failure(job)
        for dependent in ended:
            self.announce(dependent)
        return ended

    def _commit_failure(self, job: Job) -> list[Job]:
        """Commit a final failure together with its cascade. The dependents are held busy
        first, outside the dependency lock (a cancel of one of them may be committing, and
        needs the lock), in id order: every dependent has a higher id than what it depends
        on, so two cascades never wait for each other in a circle. Once held, the cascade is
        decided again from their versions as they stand; it is committed when it needs no
        job that is not held yet."""
        held: set[int] = set()
        with contextlib.ExitStack() as holding:
            while True:
                with self.dependency_lock:
                    ended = dependencies.cascade(job, self.table.dependents, self.now())
                    more = [dependent.seq for dependent in ended if dependent.seq not in held]
                    if not more:
                        self._save(job, ended)
                        return ended
                for seq in more:
                    holding.enter_context(self.table.changing(seq))
                    held.add(seq)

    def _save(self, job: Job, ended: Sequence[Job], becomes_final: bool = True) -> None:
        changed = (job, *ended)
        events: tuple[OutboxEvent, ...] = ()
        # A job is saved in a final status once: the change that made it final.
        if self.final_event is not None and becomes_final:
            events = tuple(
                OutboxEvent(one.seq, self.final_event(one)) for one in changed if one.is_final
            )
        self.store.save(*changed, events=events)  # with their output
        for one in changed:
            self.table.put(one)  # without it

    def commit_new(self, made: Sequence[Job]) -> None:
        """Save and show the jobs one submission makes (one job, or an array's) in one
        transaction. One created failed (its `ok` dependency had failed already) is final at
        once: its event goes with it (a new job has no dependents to take along)."""
        events: tuple[OutboxEvent, ...] = ()
        if self.final_event is not None:
            events = tuple(
                OutboxEvent(job.seq, self.final_event(job)) for job in made if job.is_final
            )
        self.store.save(*made, events=events)
        for job in made:
            self.table.put(job)

    def commit_all(self, changed: Sequence[Job]) -> None:
        """Save and show several jobs' next versions in one transaction (none becomes final)."""
        self.store.save(*changed)
        for job in changed:
            self.table.put(job)

    # --- telling -------------------------------------------------------------------------

    def created(self, job: Job, source: str) -> None:
        log.info("job %s created on node %s (from %s)", job.job_id, job.node_id, source)
        self.emit(Event.SUBMITTED, job, source)

    def created_array(self, made: Sequence[Job], source: str) -> None:
        """An array's jobs were created: one log line for them all, an event for each."""
        nodes = sorted({job.node_id for job in made})
        log.info(
            "array %s of %d jobs created on %s (from %s)",
            made[0].job_id,
            len(made),
            ", ".join(nodes) if len(nodes) <= 5 else f"{len(nodes)} nodes",
            source,
        )
        for job in made:
            self.emit(Event.SUBMITTED, job, source)

    def announce(self, new: Job) -> None:
        """Log and tell listeners what a committed change did."""
        if new.status == jobs.RUNNING:
            log.info("job %s claimed by node %s", new.job_id, new.node_id)
            self.emit(Event.STARTED, new)
        elif new.status == jobs.PENDING:
            last = new.attempts[-1]
            log.info(
                "job %s failed on node %s (exit %s), retry %d on node %s",
                new.job_id,
                last.node_id,
                last.exit_code,
                new.retry_count,
                new.node_id,
            )
            self.emit(Event.RETRIED, new)
        else:
            log.info(
                "job %s %s%s on node %s (exit %s)",
                new.job_id,
                new.status,
                f" ({new.reason})" if new.reason else "",
                new.node_id,
                new.exit_code,
            )
            self.emit(Event.FINISHED, new)

    def emit(self, event: Event, job: Job | None, detail: str = "") -> None:
        for listener in self.listeners:
            try:
                listener(event, job, detail)
            except Exception:
                log.exception("listener failed on %s", event)

    # --- small shared reads --------------------------------------------------------------

    def with_stored_output(self, job: Job) -> Job:
        """A job from the table with its (and its attempts') output read from the store."""
        if not (job.is_final or job.attempts):
            return job  # nothing has ended yet: no output anywhere
        outputs = self.store.read_outputs(job.seq)
        if outputs is None:  # removed by retention since the table was read
            raise errors.NotFound(errors.JOB_NOT_FOUND)
        return job.with_output(outputs)


def job_seq(job_id: str) -> int:
    """The sequence number of a job id; NotFound for a text that names no job."""
    seq = jobs.parse_job_id(job_id)
    if seq is None:
        raise errors.NotFound(errors.JOB_NOT_FOUND)
    return seq


def schedule_seq(schedule_id: str) -> int:
    """The sequence number of a schedule id; NotFound for a text that names none."""
    seq = schedules.parse_schedule_id(schedule_id)
    if seq is None:
        raise errors.NotFound(errors.SCHEDULE_NOT_FOUND)
    return seq
