"""The scheduler's operations: submit, poll, list, get, update, cancel, and what loops need.

This module ties the pieces together and owns the order of each operation: check the input,
compute the job's next version with the state machine (`jobs`), choose a node (`placement`),
commit it (`store`), and only then make it visible (`table`) and tell listeners (`events`).
It knows nothing of HTTP: the API and the loops both call it.

The agent poll is the one read that may change jobs: with JOB_STEALING on, an idle node's
answer is topped up with waiting jobs of nodes that cannot start them, and each such move is
committed before the answer goes out. The poll never waits on the registry: it reads the
node list the registry client last fetched.

Output lives in the store, not in the table: the reads that show it (`get`, `with_output`)
fetch it from disk after the table was asked, never holding the table's lock, and the agent's
poll (pending jobs, which show none) never touches the disk. The jobs a change returns, and
its listeners get, carry their output.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from enum import Enum
from typing import TYPE_CHECKING

from . import errors, jobs, schedules
from .config import Settings
from .jobs import Job, Output, Reason
from .placement import NodeLoad, Placement
from .registry import Nodes
from .schedule_table import ScheduleTable
from .schedules import Fired, Schedule, ScheduleChange
from .storage import OutboxEvent, Writer
from .storage.writer import CommitObserver
from .table import JobTable, NodeJobs
from .validation import JobQuery, JobRequest, JobUpdate

if TYPE_CHECKING:  # psycopg is imported only by a daemon on PostgreSQL
    from .leadership import Leadership, LeaderView

__all__ = ["Event", "Move", "NodeJobs", "NodeLoad", "Page", "Scheduler"]

log = logging.getLogger(__name__)


class Event(str, Enum):
    """What a committed change did, as told to listeners."""

    __str__ = str.__str__

    SUBMITTED = "submitted"  # detail: the source (http, sqs, schedule)
    STARTED = "started"
    FINISHED = "finished"  # a final status
    RETRIED = "retried"
    MOVED = "moved"  # detail: why (Move)
    POLLED = "polled"  # job None, detail: the node


class Move(str, Enum):
    """Why a waiting job went to another node (the detail of a `moved` event)."""

    __str__ = str.__str__

    STOLEN = "stolen"  # taken by an idle node's poll from a node that could not start it
    NODE_DOWN = "node_down"  # re-placed by the scan: its node is unhealthy or gone


Listener = Callable[[Event, "Job | None", str], None]
"""Called after a committed change as listener(event, job, detail)."""

# The request fields a job keeps as they are (delay_secs becomes the job's not_before).
_REQUEST_FIELDS = tuple(
    field.name
    for field in dataclasses.fields(JobRequest)
    if field.name in {job_field.name for job_field in dataclasses.fields(Job)}
)


@dataclasses.dataclass(frozen=True, slots=True)
class Page:
    jobs: list[Job]  # without their output: `Scheduler.with_output` reads it
    next_after: int | None  # seq to continue after, when more jobs match


class Scheduler:
    """The service: the one way in to the jobs. Every change and every read of the table, the
    store and the registry goes through here; its collaborators are private."""

    def __init__(
        self,
        settings: Settings,
        store: Writer,
        table: JobTable,
        placement: Placement,
        schedule_table: ScheduleTable | None = None,
        leadership: Leadership | None = None,
    ) -> None:
        self.settings = settings
        self._store = store
        self._table = table
        self._placement = placement
        self._final_event: Callable[[Job], str] | None = None  # see keep_final_events
        self._schedules = schedule_table or ScheduleTable()
        self._leadership = leadership  # None with SQLite: the one daemon always serves
        self.listeners: list[Listener] = []

    # --- leadership (PostgreSQL) -------------------------------------------------------------

    def is_serving(self) -> bool:
        """Whether this daemon answers the API itself: always with SQLite; with PostgreSQL
        only while it leads (a standby sends clients to the leader)."""
        return self._leadership is None or self._leadership.is_serving()

    def leader(self) -> LeaderView | None:
        """Who leads; None with SQLite, where this daemon is the only one."""
        return None if self._leadership is None else self._leadership.view()

    def take_over(self) -> int:
        """Begin a term as leader: every job and schedule from the store in fresh tables, so
        nothing of an earlier term survives; ids go on after the store's high-water marks.
        Returns the number of jobs."""
        loaded = self._store.reload()
        self._table = JobTable(loaded.jobs, loaded.last_seq)
        self._placement.count_loads_in(self._table)
        self._schedules = ScheduleTable(loaded.schedules, loaded.last_schedule_seq)
        log.info(
            "loaded %d jobs (last id job-%d), %d schedules, %d SNS events waiting",
            len(loaded.jobs),
            loaded.last_seq,
            len(loaded.schedules),
            loaded.events,
        )
        return len(loaded.jobs)

    def hand_over(self) -> None:
        """End a term: forget the jobs and schedules (a standby holds none)."""
        self._table = JobTable()
        self._placement.count_loads_in(self._table)
        self._schedules = ScheduleTable()

    # --- reads ----------------------------------------------------------------------------

    def get(self, job_id: str) -> Job:
        """One job with its output and its earlier attempts' (read from the store)."""
        job = self._table.get(self._seq(job_id))
        if job is None:
            raise errors.NotFound(errors.JOB_NOT_FOUND)
        return self._with_stored_output(job)

    def list_jobs(self, query: JobQuery) -> Page:
        """Jobs matching the query, oldest first (the agent's own query is `poll`), without
        their output."""
        found, more = self._table.query(
            query.node_id, query.status, query.job_type, query.after, query.limit, query.reason
        )
        return Page(found, found[-1].seq if more and found else None)

    def with_output(self, found: Sequence[Job]) -> Iterator[Job]:
        """The jobs of a page, in order, each with its latest output, read from the store one
        job at a time as the caller goes: a page of big outputs is never in memory at once.
        A job that retention removed since the page was taken is left out."""
        stored = self._store.read_latest_outputs([job.seq for job in found if job.is_final])
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

    def poll(self, node_id: str) -> list[Job]:
        """The agent poll: the node's oldest pending jobs that are due (a delayed job waits
        for its not_before), at most as many as its free slots; with JOB_STEALING, free slots
        its own queue cannot fill are topped up with the oldest due waiting jobs of nodes that
        cannot start them (moved here before this returns)."""
        nodes = self._placement.registry.cached_nodes()  # never a registry call on this path
        slots = self._placement.slots(node_id, nodes)
        stealing = self.settings.job_stealing
        now = jobs.now_us()
        found = self._table.poll(node_id, slots, now, remember=stealing)
        if stealing and nodes is not None and self._placement.may_take(node_id, nodes):
            (load,) = self._placement.loads([node_id], nodes, now)
            wanted = load.free - len(found)
            if wanted > 0:
                found += self._take_over(node_id, nodes, wanted, now)
        self._emit(Event.POLLED, None, node_id)
        return found

    def counts(self) -> dict[str, int]:
        """Number of jobs in each status."""
        return self._table.counts()

    def running(self) -> list[Job]:
        """Every running job (O(running), not O(history))."""
        return self._table.running()

    def busy_nodes(self) -> set[str]:
        """Nodes that have pending or running jobs, or a timed-out job keeping a slot."""
        return self._table.busy_nodes()

    def jobs_on(self, node_id: str) -> NodeJobs:
        """The node's pending, running and slot-holding timed-out jobs, oldest first."""
        return self._table.on_node(node_id)

    def node_health(self) -> Nodes:
        """The registry's compute nodes and their health; PlacementError when unreachable."""
        return self._placement.registry.nodes()

    def node_loads(self, node_ids: list[str], nodes: Nodes | None) -> list[NodeLoad]:
        """Slots, waiting `run` jobs and slots in use of each node (O(nodes)); slots from
        `nodes` when MAX_JOBS_PER_NODE is `auto`."""
        return self._placement.loads(node_ids, nodes)

    def cached_nodes(self) -> Nodes | None:
        """The registry's node list as last fetched, however old; never calls the registry."""
        return self._placement.registry.cached_nodes()

    def queue_depths(self) -> dict[str, int]:
        """Due pending jobs of every node that has any."""
        return self._table.queue_depths()

    def store_health(self) -> tuple[bool, str | None]:
        """Whether the store can be written (its latest write or probe, at most a few seconds
        old, succeeded), and the error when it cannot."""
        return self._store.health()

    def recent_jobs(self, since_us: int) -> list[Job]:
        """Every job that is pending or running, or finished at or after `since_us`, oldest
        first: what the dashboard's last-hour chart counts. O(recent jobs), not O(history)."""
        return self._table.recent(since_us)

    def watch_commits(self, observer: CommitObserver) -> None:
        """Have `observer` told the duration and size of every group commit."""
        self._store.commit_observers.append(observer)

    def schedule(self) -> str:
        """The node the next submission would go to; a pure read (the rotation stays)."""
        return self._placement.peek()

    def health(self) -> dict[str, object]:
        body: dict[str, object] = {"service": "scheduler"}
        if self._leadership is not None and not self._leadership.is_serving():
            # A standby writes nothing: it is healthy while it can reach the database.
            reachable, error = self._leadership.health()
            body.update(status="healthy" if reachable else "unhealthy", role="standby")
            if error is not None:
                body["error"] = f"job database cannot be reached: {error}"
            return body
        # The store's own probe keeps its verdict fresh: nothing here touches the disk, so
        # load balancers may poll as often as they like.
        healthy, error = self._store.health()
        body["status"] = "healthy" if healthy else "unhealthy"
        if self._leadership is not None:
            body["role"] = "leader"
        body["jobs"] = self._table.counts()
        if not healthy:
            body["error"] = f"job store cannot be written: {error}"
        # The registry's state as last seen (never a call from here: a health check must not
        # wait on a peer). It does not make the scheduler unhealthy: agents still poll and
        # report while it is away.
        registry = self._placement.registry.last_outcome()
        body["registry"] = "unknown" if registry is None else "unreachable" if registry else "ok"
        if registry:
            body["registry_error"] = registry
        return body

    # --- the outbox of final-state events -------------------------------------------------

    def keep_final_events(self, message: Callable[[Job], str]) -> None:
        """From now on, store `message(job)` in the outbox with every change that makes a job
        final, in the same transaction: the event is durable exactly when the change is."""
        self._final_event = message

    def waiting_events(self, limit: int) -> list[OutboxEvent]:
        """The oldest events not yet delivered (at most `limit`), oldest first; StoreError
        when the store cannot be read."""
        return self._store.outbox(limit)

    def events_delivered(self, ids: Iterable[int]) -> None:
        """Remove delivered events from the outbox; StoreError when that cannot be stored."""
        self._store.delivered(ids)

    def events_waiting(self) -> int:
        """How many events the outbox holds (no I/O)."""
        return self._store.events_waiting

    # --- changes ----------------------------------------------------------------------------

    def submit(
        self, request: JobRequest, dedupe_key: str | None = None, source: str = "http"
    ) -> tuple[Job, bool]:
        """Create a pending job, durable before this returns. With a dedupe key that already
        created a job, return that job instead; the bool says whether a job was created."""
        with self._table.deduplicating(dedupe_key) as existing:
            if existing is not None:
                return self._with_stored_output(existing), False
            node_id = self._placement.place(request.instance_id)
            with self._table.creating() as seq:
                job = self._new_job(request, dedupe_key, seq, node_id)
                self._commit(job)
        self._created(job, source)
        return job, True

    def _new_job(
        self,
        request: JobRequest,
        dedupe_key: str | None,
        seq: int,
        node_id: str,
        schedule_id: str = "",
    ) -> Job:
        """A new pending job for the request (not yet committed). Its node is chosen first,
        and only then its id taken (`table.creating`): a slow registry must not hold back
        every listing at an id in flight."""
        now = jobs.now_us()
        fields = {name: getattr(request, name) for name in _REQUEST_FIELDS}
        if request.delay_secs:
            fields["not_before"] = now + request.delay_secs * 1_000_000
        return Job(
            seq=seq,
            node_id=node_id,
            created_at=now,
            dedupe_key=dedupe_key,
            schedule_id=schedule_id,
            **fields,
        )

    def _created(self, job: Job, source: str) -> None:
        log.info("job %s created on node %s (from %s)", job.job_id, job.node_id, source)
        self._emit(Event.SUBMITTED, job, source)

    def update(self, job_id: str, update: JobUpdate) -> Job:
        """Apply an agent's report: the claim (running), or the end of an attempt. The late
        end of an attempt that timed out leaves the job as it is and frees its slot."""
        seq = self._seq(job_id)
        with self._table.changing(seq) as job:
            late = jobs.is_late_report(job, update.status)
            if late:
                new = self._late_report(job, update)
            else:
                now = jobs.now_us()
                try:
                    if update.status == jobs.RUNNING:
                        new = jobs.start(job, now)
                    else:
                        new = self._end_attempt(job, update, now)
                except jobs.TransitionError as exc:
                    raise errors.Conflict(str(exc)) from None
                self._commit(new)
        if late:
            # The job as it stands, with the output its timeout gave it (on disk by now).
            return self._with_stored_output(new)
        self._announce(new)
        return new

    def _late_report(self, job: Job, update: JobUpdate) -> Job:
        """(Busy marker held.) The agent ended an attempt the scheduler had timed out."""
        log.info(
            "job %s: late %s report (exit %s) from node %s after its timeout; job unchanged",
            job.job_id,
            update.status,
            update.exit_code,
            job.node_id,
        )
        if not job.holds_slot:
            return job  # a repeated report, or the node was counted as lost meanwhile
        freed = jobs.release_slot(job)
        self._commit(freed, becomes_final=False)
        log.info("job %s: node %s's slot freed", job.job_id, job.node_id)
        return freed

    def cancel(self, job_id: str) -> Job:
        seq = self._seq(job_id)
        with self._table.changing(seq) as job:
            try:
                new = jobs.cancel(job, jobs.now_us())
            except jobs.TransitionError as exc:
                raise errors.Conflict(str(exc)) from None
            self._commit(new)
        self._announce(new)
        return new

    def fail_running(self, seq: int, reason: Reason) -> Job | None:
        """Fail a running job from the scheduler's side (`timeout`, `node_lost`), with the
        retry rule; None when the job is no longer running by the time it is looked at."""
        with self._table.changing(seq) as job:
            if job.status != jobs.RUNNING:
                return None
            new = self._maybe_retry(jobs.fail_by_scheduler(job, reason, jobs.now_us()))
            self._commit(new)
        self._announce(new)
        return new

    def release_slot(self, seq: int) -> Job | None:
        """Free the slot a timed-out job kept (its node counts as lost: whatever ran there is
        gone); None when it holds none by now."""
        with self._table.changing(seq) as job:
            if not job.holds_slot:
                return None
            new = jobs.release_slot(job)
            self._commit(new, becomes_final=False)
        log.info("job %s: slot on lost node %s freed", job.job_id, job.node_id)
        return new

    def move_pending(self, seq: int) -> Job | None:
        """Place a pending job again (its node is gone); None when it is no longer pending
        or no other node can take it."""
        with self._table.changing(seq) as job:
            if job.status != jobs.PENDING or job.instance_id:
                return None
            node_id = self._placement.place(avoid=job.node_id)
            if node_id == job.node_id:
                return None
            new = job.evolve(node_id=node_id, moved_from=job.node_id)
            self._commit(new)
        log.info("job %s moved from node %s to %s (node down)", job.job_id, job.node_id, node_id)
        self._emit(Event.MOVED, new, Move.NODE_DOWN)
        return new

    def _take_over(self, node_id: str, nodes: Nodes, wanted: int, now: int) -> list[Job]:
        """Move up to `wanted` of the oldest waiting jobs of nodes that cannot start them to
        `node_id`, committed before this returns; the moved jobs, oldest first.

        A job is checked again once it is held busy: its old node's agent may have claimed
        it, or been offered it, since the candidates were read. The claim and the move take
        turns on the same busy marker, so exactly one of them happens to a pending job.
        """
        others = [node for node in self._table.movable_nodes() if node != node_id]
        if not others:
            return []
        donors = [
            load.node_id
            for load in self._placement.loads(others, nodes, now)
            if self._placement.gives_work(load, nodes)
        ]
        candidates = self._table.movable(donors, now, wanted) if donors else []
        if not candidates:
            return []
        moved: list[Job] = []
        with contextlib.ExitStack() as held:
            # In id order, as every other poll's take-over: two of them never wait for each
            # other's busy jobs in a circle (nothing else holds more than one).
            for candidate in candidates:
                job = held.enter_context(self._table.changing(candidate.seq))
                if (
                    job.node_id == candidate.node_id
                    and jobs.can_move(job)
                    and not self._table.just_offered(job, now)
                ):
                    moved.append(job.evolve(node_id=node_id, moved_from=job.node_id))
            if not moved:
                return []
            try:
                self._store.save(*moved)
            except errors.StoreError as exc:
                # The poll is a read and goes on from memory when the store cannot write
                # (the contract): the node gets its own jobs, the others stay where they are.
                log.warning("poll of node %s: jobs not moved: %s", node_id, exc.message)
                return []
            for job in moved:
                self._table.put(job)
            self._table.offered(node_id, moved, now)
        for job in moved:
            log.info(
                "job %s moved from node %s to idle node %s", job.job_id, job.moved_from, node_id
            )
            self._emit(Event.MOVED, job, Move.STOLEN)
        return moved

    def expire(self, cutoff: int, limit: int = 10000) -> int:
        """Delete up to `limit` jobs that finished before `cutoff`; returns how many."""
        seqs = self._table.finished_before(cutoff, limit)
        if seqs:
            self._store.delete(seqs)
            self._table.remove(seqs)
            log.info("retention removed %d finished jobs", len(seqs))
        return len(seqs)

    # --- schedules ---------------------------------------------------------------------------

    def list_schedules(self) -> list[Schedule]:
        """Every schedule, oldest first."""
        return self._schedules.all()

    def get_schedule(self, schedule_id: str) -> Schedule:
        schedule = self._schedules.get(self._schedule_seq(schedule_id))
        if schedule is None:
            raise errors.NotFound(errors.SCHEDULE_NOT_FOUND)
        return schedule

    def create_schedule(self, change: ScheduleChange, now: int | None = None) -> Schedule:
        """A new schedule from a checked POST body (name, cron and job given), durable before
        this returns; its first fire time is the first after `now` (default: the clock).
        Conflict for a taken name."""
        with self._schedules.changing():
            assert change.name is not None and change.cron is not None and change.job is not None
            self._check_name_free(change.name)
            now = jobs.now_us() if now is None else now
            schedule = Schedule(
                seq=self._schedules.new_seq(),
                name=change.name,
                cron=change.cron,
                timezone=change.timezone or schedules.DEFAULT_TIMEZONE,
                job=change.job,
                overlap=change.overlap or schedules.Overlap.SKIP,
                catch_up=bool(change.catch_up),
                paused=bool(change.paused),
                created_at=now,
            )
            schedule = schedule.evolve(next_run_at=schedules.next_fire(schedule, now))
            self._store.save_schedule(schedule)
            self._schedules.put(schedule)
        log.info(
            "schedule %s (%s) created: %r in %s, next run %s",
            schedule.schedule_id,
            schedule.name,
            schedule.cron,
            schedule.timezone,
            _time_or_none(schedule.next_run_at),
        )
        return schedule

    def update_schedule(
        self, schedule_id: str, change: ScheduleChange, now: int | None = None
    ) -> Schedule:
        """Change the given fields. A new cron or time zone, or a resume, computes the next
        fire time afresh from `now` (default: the clock): times that passed while it was
        paused do not fire."""
        with self._schedules.changing():
            old = self.get_schedule(schedule_id)
            given = change.given()
            if given.get("name", old.name) != old.name:
                self._check_name_free(given["name"])
            new = old.evolve(**given)
            timing = (new.cron, new.timezone) != (old.cron, old.timezone)
            if timing or (old.paused and not new.paused):
                now = jobs.now_us() if now is None else now
                new = new.evolve(next_run_at=schedules.next_fire(new, now))
            if new != old:
                self._store.save_schedule(new)
                self._schedules.put(new)
        if new != old:
            log.info("schedule %s (%s) changed: %s", new.schedule_id, new.name, sorted(given))
        return new

    def delete_schedule(self, schedule_id: str) -> None:
        """Remove a schedule; the jobs it made stay, and its id is never used again."""
        with self._schedules.changing():
            schedule = self.get_schedule(schedule_id)
            self._store.delete_schedule(schedule.seq)
            self._schedules.remove(schedule.seq)
        log.info("schedule %s (%s) deleted", schedule.schedule_id, schedule.name)

    def due_schedules(self, now: int) -> list[Schedule]:
        """Unpaused schedules whose next fire time has come by `now`."""
        return self._schedules.due(now)

    def fire_schedule(
        self, seq: int, now: int, since: int, failure: schedules.SkipCause | None = None
    ) -> Fired | None:
        """Look at one due schedule at `now` and do what `schedules.plan` decides: skip fire
        times, and submit the job of the latest one exactly as POST /jobs would, with
        `schedule_id` set. The job and the schedule's new state are committed together, and
        the job's dedupe key names the schedule and fire time, so a fire time never gets two
        jobs, whatever crashed when. None when nothing was due (any more).

        A fire that fails (no node, the store) leaves the schedule at that fire time, to be
        tried again on the next look; the fire times skipped before it are committed."""
        with self._schedules.changing():
            schedule = self._schedules.get(seq)
            if schedule is None:
                return None
            previous = self._table.get(schedule.last_job_seq or 0)
            active = previous is not None and previous.status in (jobs.PENDING, jobs.RUNNING)
            plan = schedules.plan(schedule, now, since, active, failure)
            if plan is None:
                return None
            if plan.fire_at is None:
                self._save_schedule(schedule.evolve(next_run_at=plan.cursor))
                return Fired(schedule, plan)
            try:
                job, created = self._fire(schedule, plan.fire_at, plan.cursor)
            except (errors.PlacementError, errors.StoreError) as exc:
                if plan.skipped:
                    self._save_schedule(schedule.evolve(next_run_at=plan.latest))
                return Fired(schedule, plan, error=exc)
        if created:
            self._created(job, "schedule")
        return Fired(schedule, plan, job, created)

    def _fire(self, schedule: Schedule, fire_at: int, cursor: int | None) -> tuple[Job, bool]:
        key = schedules.fire_key(schedule.seq, fire_at)
        with self._table.deduplicating(key) as existing:
            if existing is not None:
                # The fire made its job before a crash took the schedule's own update: record
                # that job rather than make a second one.
                self._save_schedule(
                    schedule.evolve(
                        next_run_at=cursor, last_run_at=fire_at, last_job_seq=existing.seq
                    )
                )
                return existing, False
            node_id = self._placement.place(schedule.job.instance_id)
            with self._table.creating() as seq:
                job = self._new_job(schedule.job, key, seq, node_id, schedule.schedule_id)
                fired = schedule.evolve(next_run_at=cursor, last_run_at=fire_at, last_job_seq=seq)
                self._store.save_schedule(fired, job)
                self._table.put(job)
            self._schedules.put(fired)
        return job, True

    def _save_schedule(self, schedule: Schedule) -> None:
        self._store.save_schedule(schedule)
        self._schedules.put(schedule)

    def _check_name_free(self, name: str) -> None:
        if self._schedules.named(name) is not None:
            raise errors.Conflict(f"schedule {name} already exists")

    def _schedule_seq(self, schedule_id: str) -> int:
        seq = schedules.parse_schedule_id(schedule_id)
        if seq is None:
            raise errors.NotFound(errors.SCHEDULE_NOT_FOUND)
        return seq

    # --- helpers -----------------------------------------------------------------------------

    def _seq(self, job_id: str) -> int:
        seq = jobs.parse_job_id(job_id)
        if seq is None:
            raise errors.NotFound(errors.JOB_NOT_FOUND)
        return seq

    def _with_stored_output(self, job: Job) -> Job:
        """A job from the table with its (and its attempts') output read from the store."""
        if not (job.is_final or job.attempts):
            return job  # nothing has ended yet: no output anywhere
        outputs = self._store.read_outputs(job.seq)
        if outputs is None:  # removed by retention since the table was read
            raise errors.NotFound(errors.JOB_NOT_FOUND)
        return job.with_output(outputs)

    def _end_attempt(self, job: Job, update: JobUpdate, now: int) -> Job:
        cap = self.settings.max_output_bytes
        new = jobs.finish(
            job,
            update.status,
            update.exit_code,
            jobs.cap_output(update.stdout, cap),
            jobs.cap_output(update.stderr, cap),
            now,
        )
        return self._maybe_retry(new)

    def _maybe_retry(self, failed: Job) -> Job:
        if not jobs.should_retry(failed, self.settings.max_job_retries):
            return failed
        try:
            node_id = self._placement.place(failed.instance_id, avoid=failed.node_id)
        except errors.PlacementError as exc:
            # The agent never repeats its final report, so a registry hiccup must not turn
            # it into an error: keep the node; the lost-node scan moves the job if need be.
            log.warning("job %s: retry stays on node %s (%s)", failed.job_id, failed.node_id, exc)
            node_id = failed.node_id
        return jobs.retry(failed, node_id)

    def _commit(self, job: Job, becomes_final: bool = True) -> None:
        """Save and show the job's next version. `becomes_final` is False for a change to a
        job that was final already (a timed-out job's slot freed): its event went out with
        the change that made it final."""
        events: tuple[OutboxEvent, ...] = ()
        # A job is saved in a final status once: the change that made it final.
        if self._final_event is not None and job.is_final and becomes_final:
            events = (OutboxEvent(job.seq, self._final_event(job)),)
        self._store.save(job, events=events)  # with its output
        self._table.put(job)  # without it

    def _announce(self, new: Job) -> None:
        """Log and tell listeners what a committed change did."""
        if new.status == jobs.RUNNING:
            log.info("job %s claimed by node %s", new.job_id, new.node_id)
            self._emit(Event.STARTED, new)
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
            self._emit(Event.RETRIED, new)
        else:
            log.info(
                "job %s %s%s on node %s (exit %s)",
                new.job_id,
                new.status,
                f" ({new.reason})" if new.reason else "",
                new.node_id,
                new.exit_code,
            )
            self._emit(Event.FINISHED, new)

    def _emit(self, event: Event, job: Job | None, detail: str = "") -> None:
        for listener in self.listeners:
            try:
                listener(event, job, detail)
            except Exception:
                log.exception("listener failed on %s", event)


def _time_or_none(us: int | None) -> str:
    return jobs.format_time(us) if us is not None else "never"
